"""The only package that imports llama_cpp: llama.cpp, as specgen uses it.

- ``llama``: a GGUF loaded (``LlamaModel``) or its vocabulary alone (``Vocabulary``): tokenize,
  decode with chosen logits rows, roll back the cache; llama.cpp's quantizer;
- ``ggml``: devices, llama.cpp's RPC backend (workers), and where a model's layers go;
- ``rows``: a decode's rows as their top-k from llama.cpp's backend sampling;
- ``mtp``: a model's own MTP head, following its decodes (``attach_mtp``);
- ``heads``: an EAGLE3 or DFlash head beside a model, reading its hidden states
  (``attach_head``);
- ``grammar``: llguidance's tokenizer for a vocabulary;
- ``runtime``: llama.cpp's process-wide state (logs, backends) and what the build is.

It knows nothing of speculation: the engine decides what to decode and which rows to read.
"""

from __future__ import annotations

from specgen.backend.ggml import (
    LOCAL_HEAD_PATTERN,
    RPC_REBUILD,
    Device,
    require_rpc,
    serve_worker,
    served_devices,
    supports_gpu_offload,
    worker_devices,
)
from specgen.backend.heads import HEAD_KINDS, supports_heads
from specgen.backend.heads import attach as attach_head
from specgen.backend.llama import (
    LlamaModel,
    ModelOptions,
    Vocabulary,
    backend_sampling,
    quantize,
)
from specgen.backend.mtp import attach as attach_mtp
from specgen.backend.mtp import supports_mtp
from specgen.backend.runtime import decode_seconds, library_version, supports_rpc, system_info

__all__ = [
    "HEAD_KINDS",
    "LOCAL_HEAD_PATTERN",
    "RPC_REBUILD",
    "Device",
    "LlamaModel",
    "ModelOptions",
    "Vocabulary",
    "attach_head",
    "attach_mtp",
    "backend_sampling",
    "decode_seconds",
    "library_version",
    "quantize",
    "require_rpc",
    "serve_worker",
    "served_devices",
    "supports_gpu_offload",
    "supports_heads",
    "supports_mtp",
    "supports_rpc",
    "system_info",
    "worker_devices",
]
