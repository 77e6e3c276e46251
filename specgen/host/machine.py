"""What this machine is, as far as speed goes: its CPU, its cores, the llama.cpp build in use.

These facts key what specgen remembers about speed (the costs ``-k auto`` measured, what
``specgen bench`` found, the CPU self-test's verdict): a figure measured on another CPU, with
another build or another thread count does not hold here. Read from ``/proc/cpuinfo`` and the
installed llama-cpp-python files; nothing here loads llama.cpp.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Callable
from pathlib import Path


def cpu_flags() -> str:
    """The CPU's feature flags (Linux), else what the platform says of the processor."""
    return _cpuinfo(("flags", "Features"))


def cpu_name() -> str:
    """The CPU's model name (Linux), else what the platform says of the processor."""
    return _cpuinfo(("model name",))


def _cpuinfo(keys: tuple[str, ...]) -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(keys):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def physical_cores() -> int | None:
    """Physical cores (Linux: distinct core ids per socket), or None where unknown."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    cores = set(re.findall(r"physical id\s*:\s*(\d+)\n(?:.*\n)*?core id\s*:\s*(\d+)", text))
    return len(cores) or None


def default_threads() -> int:
    """llama.cpp's habit: physical cores, approximated as half the logical CPUs above four."""
    n = os.cpu_count() or 1
    return n if n <= 4 else n // 2


# Other processes' load, in CPUs, from which the default threads leave cores to them.
BUSY_FROM = 0.5


def cpu_times() -> tuple[int, int] | None:
    """The machine's (all, idle) CPU time so far in clock ticks (Linux), or None."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 4:
        return None
    return sum(fields[:8]), fields[3] + (fields[4] if len(fields) > 4 else 0)


def own_cpu_seconds() -> float:
    """CPU time this process (with its finished children) has used."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def others_busy(
    before: tuple[int, int] | None, after: tuple[int, int] | None, own_seconds: float
) -> float | None:
    """How many CPUs other processes kept busy between two ``cpu_times`` readings, this
    process's own ``own_seconds`` of CPU time taken out (None: not known here)."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = after[0] - before[0]
    busy = total - (after[1] - before[1]) - own_seconds * ticks
    return max(0.0, busy / (total / (os.cpu_count() or 1)))


def load_now(seconds: float = 0.1) -> float | None:
    """The CPUs other processes keep busy now, measured over ``seconds`` (None: unknown)."""
    import time

    before, own = cpu_times(), own_cpu_seconds()
    time.sleep(seconds)
    return others_busy(before, cpu_times(), own_cpu_seconds() - own)


def load_meter() -> Callable[[], float | None]:
    """Start measuring other processes' load: the function returned says how many CPUs they
    kept busy since (None: not known here)."""
    before, own = cpu_times(), own_cpu_seconds()
    return lambda: others_busy(before, cpu_times(), own_cpu_seconds() - own)


def threads_given(cores: int, cpus: int, others: float | None) -> int:
    """The threads for a run: llama.cpp's ``cores``, less the CPUs other processes keep busy
    (a thread that shares its core with a busy process waits for it, and every thread of a
    decode waits for the slowest), at least one."""
    if others is None or others < BUSY_FROM:
        return cores
    return max(1, min(cores, cpus - round(others)))


def threads_for_now() -> tuple[int, str | None]:
    """The default threads on this machine as it is now, and a line saying why when the load
    of other processes lowered them."""
    cores, cpus = default_threads(), os.cpu_count() or 1
    others = load_now()
    threads = threads_given(cores, cpus, others)
    if threads == cores or others is None:
        return cores, None
    return threads, (
        f"other processes keep {others:.1f} of {cpus} CPUs busy: {threads} "
        f"thread{'s' if threads != 1 else ''} instead of {cores} (-t {cores} to use them anyway)"
    )


def build_id() -> str:
    """What identifies the llama.cpp build in use: its shared libraries (path, size, mtime)."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return "no-llama-cpp"
    lib = Path(spec.origin).parent / "lib"
    parts = []
    for found in sorted(lib.glob("*.so*")) + sorted(lib.glob("*.dylib")):
        if found.is_file() and not found.is_symlink():
            info = found.stat()
            parts.append(f"{found}:{info.st_size}:{info.st_mtime_ns}")
    return "|".join(parts) or spec.origin


def available_memory() -> int | None:
    """Bytes of memory a new process can take without swapping (Linux's MemAvailable); None
    where the system does not say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
