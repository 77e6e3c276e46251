"""llama.cpp's process-wide state, as specgen sets it up once: its logs (silent unless asked)
and its backends, and what the build is (version, system info, RPC)."""

from __future__ import annotations

import ctypes
import sys
import time
from collections.abc import Callable

import llama_cpp

# llama.cpp logs through this callback for the life of the process; the ctypes object must stay
# referenced from Python, or the next log line from C jumps into freed memory.
_log_state: dict[str, object] = {"verbose": False, "callback": None}


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    if _log_state["verbose"]:
        sys.stderr.write(text.decode("utf-8", errors="replace"))


_log_state["callback"] = _log_callback
_backend_ready = False
# Seconds spent in llama.cpp's decodes and encodes (every context of this process), waited for
# to the end.
_decoding = [0.0]


def decode(ctx: llama_cpp.llama_context_p, batch: llama_cpp.llama_batch) -> int:
    """``llama_decode``, waited for (a GPU's decode returns before the graph has run) and
    timed: the time outside it is the loop's own host work (``decode_seconds``)."""
    return _waited(llama_cpp.llama_decode, ctx, batch)


def encode(ctx: llama_cpp.llama_context_p, batch: llama_cpp.llama_batch) -> int:
    """``llama_encode`` (an EAGLE3 head's fusion of the target's states), waited for and timed
    as ``decode`` is."""
    return _waited(llama_cpp.llama_encode, ctx, batch)


def _waited(
    call: Callable[[llama_cpp.llama_context_p, llama_cpp.llama_batch], int],
    ctx: llama_cpp.llama_context_p,
    batch: llama_cpp.llama_batch,
) -> int:
    started = time.perf_counter()
    status = int(call(ctx, batch))
    if status == 0:
        llama_cpp.llama_synchronize(ctx)
    _decoding[0] += time.perf_counter() - started
    return status


def decode_seconds() -> float:
    """Seconds this process has spent in llama.cpp's decodes so far, all models together."""
    return _decoding[0]


def init_backend(verbose: bool) -> None:
    global _backend_ready
    _log_state["verbose"] = verbose
    if not _backend_ready:
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _backend_ready = True


def system_info() -> str:
    """llama.cpp's own description of the build (CPU features, GPU backends)."""
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip()


def supports_rpc() -> bool:
    """Whether this build has llama.cpp's RPC backend (``-DGGML_RPC=ON``)."""
    return bool(llama_cpp.llama_supports_rpc())


def library_version() -> str:
    return str(getattr(llama_cpp, "__version__", "unknown"))
