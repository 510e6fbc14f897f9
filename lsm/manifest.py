"""The manifest: what a store directory is, checked on every open.

It names the format version, the store's id, and the remote tier's URI. It is small and
rewritten rarely (create, change of remote), always by write-temp + fsync + rename + directory
fsync, so a crash leaves the old manifest or the new one. Bytes (FORMAT.md):

    magic "NSLSMMAN" | format version u32 LE | length u32 LE | xxh3_64(body) u64 LE | body

with body a msgpack map.
"""

from __future__ import annotations

import os
import struct
import uuid
from dataclasses import dataclass

import msgpack
import xxhash

from lsm import files
from lsm.errors import CorruptLogError, FormatVersionError
from lsm.records import FORMAT_VERSION

MAGIC = b"NSLSMMAN"
HEADER = struct.Struct("<8sIIQ")
NAME = "MANIFEST"


@dataclass(frozen=True)
class Manifest:
    """What a store directory is: the store's id and the URI of its remote tier."""

    store_id: str
    remote: str

    @staticmethod
    def new(remote: str) -> Manifest:
        """The manifest of a new store, with a fresh id, whose remote tier is `remote`."""
        return Manifest(uuid.uuid4().hex, remote)


def write_manifest(directory: str, manifest: Manifest) -> None:
    """Writes `manifest` into `directory`, replacing the old one atomically."""
    body = msgpack.packb({"store_id": manifest.store_id, "remote": manifest.remote})
    header = HEADER.pack(MAGIC, FORMAT_VERSION, len(body), xxhash.xxh3_64_intdigest(body))
    files.replace_atomically(os.path.join(directory, NAME), header + body)


def read_manifest(directory: str) -> Manifest | None:
    """The manifest of `directory`, None if it has none; raises on damage or another format."""
    path = os.path.join(directory, NAME)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if len(data) < HEADER.size:
        raise CorruptLogError(path, 0, "manifest shorter than its header")
    magic, version, n, checksum = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptLogError(path, 0, "not a store manifest (bad magic)")
    if version != FORMAT_VERSION:
        raise FormatVersionError(path, version, FORMAT_VERSION)
    body = data[HEADER.size : HEADER.size + n]
    if len(body) != n or xxhash.xxh3_64_intdigest(body) != checksum:
        raise CorruptLogError(path, HEADER.size, "manifest checksum mismatch")
    fields = msgpack.unpackb(body)
    return Manifest(fields["store_id"], fields["remote"])
