"""`lsm.memory.release_free_memory` gives the C heap's free pages back to the OS: in a process of
its own, 100 MB of blocks freed in holes between live ones (none at the heap's top, so that
the allocator keeps them) leave the resident memory up until the call, and not after."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lsm.memory import _TRIM

CHILD = """
import json, os
from lsm.memory import release_free_memory

def rss_kb():
    with open(f"/proc/{os.getpid()}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

blocks = [bytearray(os.urandom(16)) * 6400 for _ in range(2000)]  # 100 KB each: from the heap, not mmap
del blocks[::2]  # 1,000 holes of 100 KB between live blocks
before = rss_kb()
release_free_memory()
print(json.dumps([before, rss_kb()]))
"""


@pytest.mark.skipif(_TRIM is None, reason="the C library has no malloc_trim")
def test_freed_holes_in_the_heap_go_back_to_the_os():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    before, after = json.loads(out.stdout)
    assert before - after >= 50_000, (before, after)  # of the 100 MB freed, at least half given back
