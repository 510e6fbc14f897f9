"""Operator state as bytes, where state crosses a process outside the store (batch jobs and
span jobs hand keyed state back to the driver): the store's own value codec (`lsm.codec`),
which keeps Python's container types apart. Never pickle: these bytes travel between
processes."""

from __future__ import annotations

from lsm.codec import pack_values as pack
from lsm.codec import unpack_values as unpack

__all__ = ["pack", "unpack"]
