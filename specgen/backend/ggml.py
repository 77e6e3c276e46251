"""ggml's devices and llama.cpp's RPC backend, reached through libllama's own handle.

The bindings expose none of this. Symbols are resolved through libllama's own handle: the wheel
ships three copies of libggml, and loading another would map a second ggml with its own
registry. A worker is probed in Python (``specgen.host.rpc``) before ggml connects to it, since ggml
aborts the process on any failure; once workers are attached, an abort that could not be
prevented (a worker that died mid-run) ends the process with one line.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

import llama_cpp

from specgen.backend import runtime
from specgen.backend.runtime import init_backend
from specgen.errors import UserError
from specgen.host import rpc
from specgen.host.machine import default_threads

_DEV_CPU, _DEV_GPU, _DEV_IGPU = 0, 1, 2
_GPU_TYPES = (_DEV_GPU, _DEV_IGPU)
# Kept on this machine when the target's layers are on workers: each verify then sends hidden
# states (kilobytes) instead of one logit row per token (a megabyte each for a 262k vocabulary).
LOCAL_HEAD_PATTERN = r"^(output|token_embd)\.weight$"
RPC_REBUILD = (
    'CMAKE_ARGS="-DGGML_RPC=ON" pip install --force-reinstall --no-cache-dir llama-cpp-python'
)
# ctypes functions of libllama, typed as they are declared (ctypes has no useful static type).
_functions: dict[str, Any] = {}


def _ggml(name: str, restype: Any, *argtypes: Any) -> Any:
    fn = _functions.get(name)
    if fn is None:
        fn = getattr(llama_cpp.llama_cpp._lib, name)
        fn.restype = restype
        fn.argtypes = list(argtypes)
        _functions[name] = fn
    return fn


@dataclass(frozen=True)
class Device:
    """One ggml device (a CPU, a GPU, or a worker's device seen through RPC)."""

    name: str
    description: str
    free_bytes: int
    total_bytes: int


def _describe_device(device: int) -> Device:
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    size_p = ctypes.POINTER(ctypes.c_size_t)
    _ggml("ggml_backend_dev_memory", None, ctypes.c_void_p, size_p, size_p)(
        device, ctypes.byref(free), ctypes.byref(total)
    )
    name = _ggml("ggml_backend_dev_name", ctypes.c_char_p, ctypes.c_void_p)(device)
    text = _ggml("ggml_backend_dev_description", ctypes.c_char_p, ctypes.c_void_p)(device)
    return Device(
        (name or b"?").decode(errors="replace"),
        (text or b"").decode(errors="replace"),
        free.value,
        total.value,
    )


def _local_devices(types: tuple[int, ...]) -> list[int]:
    count = int(_ggml("ggml_backend_dev_count", ctypes.c_size_t)())
    get = _ggml("ggml_backend_dev_get", ctypes.c_void_p, ctypes.c_size_t)
    kind = _ggml("ggml_backend_dev_type", ctypes.c_int, ctypes.c_void_p)
    return [device for i in range(count) if kind(device := get(i)) in types]


def _served_devices() -> list[int]:
    """What a worker offers: this machine's GPUs, or its CPU when it has none."""
    return _local_devices(_GPU_TYPES) or _local_devices((_DEV_CPU,))


def served_devices() -> list[Device]:
    return [_describe_device(device) for device in _served_devices()]


def require_rpc() -> None:
    """One line, with the rebuild command, where this build has no RPC backend."""
    if not runtime.supports_rpc():
        raise UserError(
            f"this build of llama.cpp has no RPC backend (needed by `specgen worker` "
            f"and --rpc); rebuild it with: {RPC_REBUILD}"
        )


def _rpc_function(name: str, restype: Any, *argtypes: Any) -> Any:
    require_rpc()
    registry = _ggml("ggml_backend_reg_by_name", ctypes.c_void_p, ctypes.c_char_p)(b"RPC")
    address = _ggml(
        "ggml_backend_reg_get_proc_address", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p
    )(registry, name.encode())
    if not registry or not address:
        raise UserError(f"this build of llama.cpp lacks {name}; rebuild it with: {RPC_REBUILD}")
    return ctypes.CFUNCTYPE(restype, *argtypes)(address)


def serve_worker(endpoint: str, n_threads: int, cache_dir: str | None) -> None:
    """Serve this machine's devices to RPC clients at ``host:port``; returns only on failure.

    One client at a time: ggml's server accepts the next connection when the current one ends.
    """
    init_backend(False)
    devices = _served_devices()
    start = _rpc_function(
        "ggml_backend_rpc_start_server",
        None,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_void_p),
    )
    array = (ctypes.c_void_p * len(devices))(*devices)
    start(
        endpoint.encode(),
        cache_dir.encode() if cache_dir else None,
        n_threads or default_threads(),
        len(devices),
        array,
    )


# Workers attached in this process (ggml keeps one connection to each for the process's life).
_attached: dict[str, list[int]] = {}


def _worker_devices(endpoint: str) -> list[int]:
    """Attach a worker (probe it first: ggml aborts on any failure) and list its devices.

    Its registry is not registered globally, or every model loaded with default devices (the
    draft) would be offloaded to it too; only the target's parameters name these devices.
    """
    devices = _attached.get(endpoint)
    if devices is None:
        add_server = _rpc_function("ggml_backend_rpc_add_server", ctypes.c_void_p, ctypes.c_char_p)
        rpc.hello(rpc.parse_endpoint(endpoint))
        _on_abort_exit()
        registry = add_server(endpoint.encode())
        count = int(_ggml("ggml_backend_reg_dev_count", ctypes.c_size_t, ctypes.c_void_p)(registry))
        get = _ggml("ggml_backend_reg_dev_get", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
        devices = [get(registry, i) for i in range(count)]
        _attached[endpoint] = devices
    return devices


def worker_devices(endpoint: str) -> list[Device]:
    """A worker's devices with their free and total memory (the worker must be probed first)."""
    init_backend(False)
    return [_describe_device(device) for device in _worker_devices(endpoint)]


_abort_state: dict[str, object] = {"callback": None}


def _on_abort_exit() -> None:
    """Once workers are attached, a ggml abort (a worker that died mid-run) ends the process with
    one line and exit code 1, instead of SIGABRT, ggml's backtrace and maybe a core dump."""
    if _abort_state["callback"] is not None:
        return

    @ctypes.CFUNCTYPE(None, ctypes.c_char_p)
    def on_abort(message: bytes | None) -> None:
        line = rpc.abort_line((message or b"").decode(errors="replace"), list(_attached))
        try:
            flusher = threading.Thread(target=sys.stdout.flush, daemon=True)
            flusher.start()
            flusher.join(1.0)  # the text generated so far, unless stdout itself is stuck
        finally:
            start = "\n" if os.isatty(2) else ""  # below a live view's last line
            os.write(2, f"{start}error: {line}\n".encode())
            os._exit(1)

    _abort_state["callback"] = on_abort  # referenced for the life of the process
    _ggml("ggml_set_abort_callback", ctypes.c_void_p, ctypes.c_void_p)(
        ctypes.cast(on_abort, ctypes.c_void_p)
    )


class _BuftOverride(ctypes.Structure):
    """llama_model_tensor_buft_override (not bound in llama-cpp-python 0.3.36)."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def place_on_workers(
    params: llama_cpp.llama_model_params, workers: tuple[str, ...], local_head: bool
) -> list[object]:
    """Point a model's layers at the workers (after this machine's GPUs, if any); returns the
    ctypes arrays that must stay referenced while the model loads."""
    devices = _local_devices(_GPU_TYPES)
    for endpoint in workers:
        devices += _worker_devices(endpoint)
    device_array = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
    # The bindings type these pointer fields as arrays; llama.cpp reads an address.
    params.devices = ctypes.cast(device_array, ctypes.c_void_p).value  # type: ignore[assignment]
    keep: list[object] = [device_array]
    if local_head:
        cpu = _ggml("ggml_backend_cpu_buffer_type", ctypes.c_void_p)()
        overrides = (_BuftOverride * 2)(
            _BuftOverride(LOCAL_HEAD_PATTERN.encode(), cpu), _BuftOverride(None, None)
        )
        params.tensor_buft_overrides = ctypes.cast(  # type: ignore[assignment]  # an address
            overrides, ctypes.c_void_p
        ).value
        keep.append(overrides)
    return keep


def supports_gpu_offload() -> bool:
    """Whether this build has a GPU to offload to (an RPC-only build answers yes to llama.cpp's
    own question, though it has no local GPU)."""
    return bool(llama_cpp.llama_supports_gpu_offload()) and bool(_local_devices(_GPU_TYPES))
