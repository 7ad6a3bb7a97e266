"""runtime/allocator.py: a process that keeps freed memory does not fault a large block in again,
step after step, once its heap has grown to hold it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from layerplan.runtime import allocator

FAULTS = r"""
import json, resource
from layerplan.runtime.allocator import keep_freed_memory
applied = keep_freed_memory()
import torch
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(16):  # the heap grows until a freed block fits the next (here after 1-9 blocks)
    t = torch.ones(16 * 2**20)  # 64 MiB: over glibc's largest mmap threshold
    del t
before = faults()
for _ in range(4):
    t = torch.ones(16 * 2**20)
    del t
print(json.dumps({"applied": applied, "faults_per_block": (faults() - before) / 4}))
"""


def faults_per_block(keep: str) -> dict:
    env = {**os.environ, allocator.ENV: keep}
    out = subprocess.run([sys.executable, "-c", FAULTS], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(allocator.ENV, "0")
    assert allocator.keep_freed_memory() is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_large_block_is_not_faulted_in_again():
    kept, defaults = faults_per_block("1"), faults_per_block("0")
    assert kept["applied"] and not defaults["applied"]
    pages = 64 * 2**20 / os.sysconf("SC_PAGE_SIZE")
    assert defaults["faults_per_block"] > 0.5 * pages  # glibc unmaps the block and faults it in again
    assert kept["faults_per_block"] < 0.05 * pages
