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
