"""Where a user declared something: errors name the line of the pipeline file."""

from __future__ import annotations

import os
import sys

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The `nosync` package: frames inside it are the engine's, not the user's."""


def declared_at() -> str:
    """file:line of the first caller outside the nosync package."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not os.path.abspath(filename).startswith(PACKAGE_DIR + os.sep):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"
