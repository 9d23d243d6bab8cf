"""The memory figure of ``textrl-bench perf``: a child process measures its own peak, not its parent's."""

import subprocess
import sys

import numpy as np
import pytest

from benchmarks.perf.memory import rss_mb


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the inherited high-water mark is Linux's")
def test_a_child_of_a_large_process_measures_its_own_peak():
    big = np.ones(300 * 2**20 // 8)  # 300 MB touched in this (parent) process
    parent = rss_mb()
    code = "from benchmarks.perf.memory import rss_mb; print(rss_mb())"
    child = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    # ru_maxrss would report at least the parent's RSS at the fork (about parent); VmHWM is the child's own
    assert parent > 300 and child < parent - 200, (parent, child)
    del big
