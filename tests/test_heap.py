"""trainer.system.malloc_mmap_threshold_kb and trainer.system.trim_heap: freed tensors go back to the
OS instead of staying in a fragmented heap; trainer.system.kernel_cache_capacity: bf16 matrix products
on the CPU keep a bounded number of compiled kernels (trainer/runtime.py says why). Each case runs in
a process of its own, since each setting holds for the whole process."""
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.runtime import cap_kernel_caches, release_freed_memory, resident_gb

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


# bf16 products of 200 shapes never seen before (as a sampler's prefills are), printing how many MB
# the resident set grew by, after a trim, with the kernel caches capped at argv[1] ("none": not).
KERNELS = """
import sys, torch
from trainer.runtime import cap_kernel_caches, trim_heap
cap_kernel_caches(None if sys.argv[1] == "none" else int(sys.argv[1]))
def rss_mb():
    trim_heap()
    line = next(l for l in open("/proc/self/status") if l.startswith("VmRSS"))
    return int(line.split()[1]) / 1024
layer = torch.nn.Linear(576, 1536)
with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
    layer(torch.ones(1, 576))
    start = rss_mb()
    for rows in range(2, 202):
        layer(torch.ones(rows, 576))
print(rss_mb() - start)
"""


def kernels_mb(capacity: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")}
    done = subprocess.run([sys.executable, "-c", KERNELS, capacity], cwd=ROOT, capture_output=True, text=True,
                          check=True, env=env)
    return float(done.stdout.split()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the resident set is read after glibc's malloc_trim")
def test_capped_kernel_caches_stop_bf16_products_of_new_shapes_from_growing_the_resident_set():
    grown = kernels_mb("none")
    if grown < 40:  # about 0.7 MB a shape where oneDNN runs bf16 (AVX512-BF16, AMX)
        pytest.skip(f"this CPU's bf16 products keep no kernel per shape ({grown:.0f} MB for 200 shapes)")
    assert kernels_mb("16") < grown / 3


def test_a_capacity_is_put_where_both_libraries_read_it_and_one_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "64")
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    assert cap_kernel_caches(None) is False and "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in os.environ
    assert cap_kernel_caches(256) is True
    assert os.environ["LRU_CACHE_CAPACITY"] == "64" and os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "256"
