"""trainer.system.malloc_mmap_threshold_kb and trainer.system.trim_heap: freed tensors go back to the
OS instead of staying in a fragmented heap (trainer/runtime.py says why). Each case runs in a process
of its own, since a threshold holds for the whole process."""
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.runtime import release_freed_memory, resident_gb

ROOT = Path(__file__).resolve().parents[1]

# Frees an 8 MB tensor (glibc then raises its threshold to 8 MB), allocates 64 tensors of 2 MB with
# a 64 KB one kept after each (so the heap's top cannot be trimmed), frees the large ones and prints
# how many MB the resident set kept.
FRAGMENT = """
import sys, torch
from trainer.runtime import release_freed_memory, trim_heap
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
if sys.argv[1] == "trim":
    assert trim_heap()
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


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_a_trim_hands_the_fragmented_heaps_free_pages_back():
    assert kept_mb("trim") < 16  # the same 128 MB freed inside the heap, not at its top


def test_the_resident_set_now_is_at_most_its_peak():
    now, peak = resident_gb()
    assert 0 < now <= peak + 0.05  # both in GB (the kernel updates the peak lazily): tens of MB, not bytes or TB
    assert peak < 64


def test_null_keeps_the_c_librarys_own_behaviour():
    assert release_freed_memory(None) is False
