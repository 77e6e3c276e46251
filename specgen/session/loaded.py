"""What a pair needs of a loaded model, and how one is made: llama.cpp's (``specgen.backend``)
or, where a test swaps them in, fakes (``Backend``; ``session.pair.BACKEND`` holds the one in
use), so that everything above the backend runs the same on both."""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from specgen.core.coupling import Picking
from specgen.core.sampling import Rows
from specgen.drafters import BlockHead, Head, Model
from specgen.engine.streams import Gather, Item
from specgen.host import machine
from specgen.models import compat
from specgen.stats import Clock

if TYPE_CHECKING:
    from specgen.backend import ModelOptions
    from specgen.backend.llama import RollbackCounts


class LoadedModel(Model, compat.VocabView, Protocol):
    """What a pair needs of a loaded model (``backend.LlamaModel`` has it; so do test fakes)."""

    path: Path
    n_threads: int
    description: str
    recurrent: bool  # a recurrent or hybrid state (``backend.llama``'s rollback ways)
    rollbacks: RollbackCounts

    n_batch: int  # tokens one decode takes at most

    def state_bytes(self) -> int: ...
    def sequence(self, seq: int) -> LoadedModel: ...
    def gather(self, gather: Gather | None) -> None: ...
    def decode_together(
        self, items: Sequence[Item], pickings: Sequence[Picking | None] | None = None
    ) -> list[Rows]: ...
    def chat_template(self) -> str | None: ...
    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]: ...


def _llama(path: Path, options: ModelOptions, verbose: bool) -> LoadedModel:
    from specgen.backend import LlamaModel

    return LlamaModel(path, options, verbose=verbose)


def _attach_mtp(model: LoadedModel) -> Head:
    from specgen.backend import LlamaModel, attach_mtp

    assert isinstance(model, LlamaModel), "an MTP head reads a llama.cpp model's hidden states"
    return attach_mtp(model)


def _attach_head(model: LoadedModel, path: Path, kind: str) -> Head | BlockHead:
    from specgen.backend import LlamaModel, attach_head

    assert isinstance(model, LlamaModel), "a head reads a llama.cpp model's hidden states"
    return attach_head(model, path, kind)


def _gpu_offload() -> bool:
    from specgen.backend import supports_gpu_offload

    return supports_gpu_offload()


@dataclass(frozen=True)
class Backend:
    """How a model file becomes a loaded model, and how generation time is read."""

    load: Callable[[Path, ModelOptions, bool], LoadedModel]
    clock: Clock = time.perf_counter
    # Seconds spent in the models' decodes so far (None: not known), to tell the loop's own
    # host work from the models' (``Stats.host_seconds``).
    busy: Clock | None = None
    # The target's own MTP head, following its decodes (``backend.mtp``).
    attach_mtp: Callable[[LoadedModel], Head] = _attach_mtp
    # An EAGLE3 or DFlash head loaded beside the target, reading its states (``backend.heads``).
    attach_head: Callable[[LoadedModel, Path, str], Head | BlockHead] = _attach_head
    # Measures the load of other processes from now on (``host.machine.load_meter``; None:
    # not measured), so that bench can tell a row that outside work disturbed.
    load_meter: Callable[[], Callable[[], float | None]] | None = machine.load_meter
    # Whether this build offloads layers to a GPU (``backend.supports_gpu_offload``).
    gpu_offload: Callable[[], bool] = _gpu_offload


def _decode_seconds() -> float:
    from specgen.backend import decode_seconds

    return decode_seconds()


def chosen_backend() -> Backend:
    """llama.cpp and the wall clock, unless ``SPECGEN_BACKEND`` names another as
    ``module:attribute`` (a ``Backend``, or a function that makes one): how a test runs the
    command line in a subprocess on fakes, as simonw/llm registers its mock model."""
    named = os.environ.get("SPECGEN_BACKEND")
    if not named:
        return Backend(_llama, busy=_decode_seconds)
    module, _, attribute = named.partition(":")
    found = getattr(importlib.import_module(module), attribute)
    backend = found if isinstance(found, Backend) else found()
    assert isinstance(backend, Backend), f"SPECGEN_BACKEND={named} is not a Backend"
    return backend
