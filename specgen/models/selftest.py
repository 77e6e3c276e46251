"""The CPU self-test: does this build of llama.cpp run on this CPU? Asked once, in a child.

A llama.cpp built for instructions this machine does not execute dies with SIGILL on its first
batched decode, a crash no Python code can catch (seen on cloud VMs that list AMX in their CPU
flags without enabling it). So before the first generation with a given build, machine and kind
of quantization, a child process loads the model and decodes one small batch; if the child is
killed by a signal, the command stops with one line that names the cause and the fix. The
verdict is cached per (build, CPU, quantization types); a rebuilt llama-cpp-python is a new key.

Run as ``python -m specgen.models.selftest FILE...`` it is the child.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from specgen.errors import CpuUnsupported
from specgen.host import store
from specgen.host.machine import build_id, cpu_flags

PORTABLE_CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
REBUILD = (
    f'CMAKE_ARGS="{PORTABLE_CMAKE_ARGS}" pip install --force-reinstall --no-cache-dir '
    f"llama-cpp-python"
)
CHILD_TIMEOUT = 600
# The format of a cached verdict (``store.write_versioned``): ``CpuVerdict``'s fields. Another
# number is set aside and the CPU tested again.
VERDICT_VERSION = 1


@dataclass(frozen=True)
class CpuVerdict:
    ok: bool
    signal: str | None = None
    detail: str = ""

    def message(self) -> str:
        if self.signal == "SIGILL":
            return (
                "llama.cpp died with SIGILL (illegal instruction) in a test decode: this "
                "build uses CPU instructions this machine does not run (often native AMX "
                "kernels on a VM that lists amx_tile without enabling it); rebuild it "
                f"portably: {REBUILD}"
            )
        return (
            f"llama.cpp crashed ({self.signal}) in a test decode on this machine; try the "
            f"portable build ({REBUILD}), and report it if that crashes too"
        )


def quant_types(paths: list[Path]) -> dict[str, Path]:
    """One file per quantization type (the smallest), read from the GGUF headers."""
    from specgen.models import gguf

    chosen: dict[str, Path] = {}
    for path in paths:
        try:
            code = gguf.file_type_code(gguf.read_local(str(path)))
        except (OSError, gguf.GGUFError):
            continue  # the real load reports what is wrong with the file
        name = gguf.FILE_TYPES.get(code, str(code)) if code is not None else "unknown"
        if name not in chosen or path.stat().st_size < chosen[name].stat().st_size:
            chosen[name] = path
    return chosen


def _stamp(types: list[str]) -> Path:
    return store.path(
        "selftest", store.text_key("\n".join([build_id(), cpu_flags(), *sorted(types)]))
    )


def cached_verdict(paths: list[Path]) -> CpuVerdict | None:
    """The cached verdict for these files' quantization types, or None if never tested."""
    found = store.read_versioned(_stamp(list(quant_types(paths))), "CPU self-test", VERDICT_VERSION)
    try:
        return CpuVerdict(**found) if found is not None else None
    except TypeError:
        return None


def run_child(command: list[str]) -> CpuVerdict | None:
    """Run a test child; a verdict when it passed or died of a signal, None when it failed
    otherwise (a file llama.cpp cannot load is for the real load to report)."""
    try:
        done = subprocess.run(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=CHILD_TIMEOUT,
            text=True,
            errors="replace",
        )
    except subprocess.TimeoutExpired:
        return None
    if done.returncode == 0:
        return CpuVerdict(True)
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        return CpuVerdict(False, name, done.stderr.strip()[-500:])
    return None


def ensure_cpu_works(paths: list[Path], command: list[str] | None = None) -> CpuVerdict | None:
    """Raise ``CpuUnsupported`` when this build of llama.cpp cannot run these models here."""
    if os.environ.get("SPECGEN_SELFTEST") == "0":
        return None
    types = quant_types(paths)
    if not types:
        return None
    stamp = _stamp(list(types))
    verdict = cached_verdict(paths)
    if verdict is None:
        verdict = run_child(
            command or [sys.executable, "-m", "specgen.models.selftest", *map(str, types.values())]
        )
        if verdict is None:
            return None
        # A read-only cache: test again next time.
        store.write_versioned(stamp, VERDICT_VERSION, asdict(verdict))
    if not verdict.ok:
        raise CpuUnsupported(verdict.message())
    return verdict


def _child(paths: list[str]) -> None:
    """Load each model and decode one batch with logits on every row, as a verify pass does."""
    from specgen.backend import LlamaModel, ModelOptions

    for path in paths:
        model = LlamaModel(path, ModelOptions(n_ctx=256))
        tokens = model.tokenize("The quick brown fox jumps over the lazy dog.")[:16]
        model.decode(tokens, len(tokens))
        model.close()


if __name__ == "__main__":
    _child(sys.argv[1:])
