"""trainer.system.malloc_mmap_threshold_kb: freed tensors go back to the OS instead of staying in a
fragmented heap (trainer/runtime.py says why). Each case runs in a process of its own, since the
setting holds for the whole process."""
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.runtime import release_freed_memory

ROOT = Path(__file__).resolve().parents[1]

# Frees an 8 MB tensor (glibc then raises its threshold to 8 MB), allocates 64 tensors of 2 MB with
# a 64 KB one kept after each (so the heap's top cannot be trimmed), frees the large ones and prints
# how many MB the resident set kept.
FRAGMENT = """
import sys, torch
from trainer.runtime import release_freed_memory
def rss_mb():
    line = next(l for l in open("/proc/self/status") if l.startswith("VmRSS"))
    return int(line.split()[1]) / 1024
if sys.argv[1] == "on":
    assert release_freed_memory(256)
big = torch.ones(2 * 2**20)
del big
start, kept, large = rss_mb(), [], []
for _ in range(64):
    large.append(torch.ones(2**19))
    kept.append(torch.ones(16384))
del large
print(rss_mb() - start)
"""


def kept_mb(setting: str) -> float:
    done = subprocess.run([sys.executable, "-c", FRAGMENT, setting], cwd=ROOT, capture_output=True, text=True,
                          check=True)
    return float(done.stdout.split()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_freed_tensors_leave_the_resident_set_with_the_threshold_and_stay_without_it():
    assert kept_mb("off") > 96  # 128 MB freed, and the fragmented heap keeps it
    assert kept_mb("on") < 16


def test_null_keeps_the_c_librarys_own_behaviour():
    assert release_freed_memory(None) is False
