"""The load of other processes, and the threads a run leaves them (``specgen.host.machine``).

Measured from /proc/stat against a real spinning process; the rule itself on made-up loads.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from specgen.host.machine import cpu_times, load_now, others_busy, own_cpu_seconds, threads_given

linux = pytest.mark.skipif(cpu_times() is None, reason="reads /proc/stat (Linux)")


def test_the_threads_leave_the_cpus_others_keep_busy() -> None:
    assert threads_given(2, 2, None) == 2  # not known: llama.cpp's default
    assert threads_given(2, 2, 0.3) == 2  # a light load changes nothing
    assert threads_given(2, 2, 1.0) == 1  # one busy process on two cores: one thread
    assert threads_given(2, 2, 2.5) == 1  # never none
    assert threads_given(8, 16, 3.2) == 8  # room to spare beside the cores used
    assert threads_given(8, 8, 3.0) == 5


@linux
def test_a_spinning_process_is_seen_and_this_ones_own_work_is_not() -> None:
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        seen = load_now(0.5)
        assert seen is not None and seen >= 0.7, seen  # it holds about one CPU
    finally:
        spinner.kill()
        spinner.wait()
    before, own = cpu_times(), own_cpu_seconds()
    end = time.monotonic() + 0.4
    while time.monotonic() < end:  # this process spins: not another's load
        pass
    after, spent = cpu_times(), own_cpu_seconds() - own
    with_own = others_busy(before, after, 0.0)
    without = others_busy(before, after, spent)
    assert with_own is not None and without is not None
    assert with_own - without >= 0.7  # its own CPU taken out
