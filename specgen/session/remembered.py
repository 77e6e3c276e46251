"""What a loaded pair remembers on this machine between processes: the costs ``-k auto``
measured (one file per model files, threads, GPU layers and workers) and how a recurrent target
rolled back (``doctor`` shows both)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specgen.host import store
from specgen.lookahead import CostBook
from specgen.lookahead.costs import COSTS_VERSION

# The rollback file's format (``store.write_versioned``): the target's ``Pair.rollback_facts``.
ROLLBACK_VERSION = 1


def rollback_path(target: Path) -> Path:
    """Where the last run on this target file left how its recurrent state rolled back."""
    return store.path("rollback", store.file_key(target))


def remember_rollbacks(target: Path, facts: dict[str, Any]) -> None:
    """Keep how a recurrent target rolled back, for ``doctor``."""
    store.write_versioned(rollback_path(target), ROLLBACK_VERSION, facts)  # read-only: not kept


def remembered_rollbacks(target: Path) -> dict[str, Any]:
    """How the last run on this target rolled back (nothing: none kept, or another format's)."""
    return store.read_versioned(rollback_path(target), "rollback", ROLLBACK_VERSION) or {}


def costs_path(files: list[Path], setting: Sequence[object]) -> Path:
    """Where the costs ``-k auto`` measured for these model files on this machine are kept,
    with ``setting`` (the threads, GPU layers and workers they were measured with)."""
    from specgen.host.machine import build_id, cpu_flags

    machine = [cpu_flags(), build_id(), *setting]
    return store.path(
        "costs", _costs_prefix(files) + store.text_key(json.dumps(machine, default=str))
    )


def _costs_prefix(files: list[Path]) -> str:
    """The part of a costs file's name that names the model files (the rest: the machine)."""
    return store.file_key(*files) + "-"


def remembered_costs(target: Path, draft: Path | None) -> CostBook | None:
    """The costs last kept for these files on this machine, whatever the threads and layers
    (``doctor`` reads them); None where no run kept any."""
    kept = store.newest("costs", _costs_prefix([target] if draft is None else [target, draft]))
    return load_costs(kept) if kept is not None else None


def load_costs(path: Path | None, say: Callable[[str], None] | None = None) -> CostBook:
    """The costs an earlier process kept at ``path`` (none, unreadable, or of another format,
    said in one line to ``say``: start afresh)."""
    if path is None:
        return CostBook()
    try:
        return CostBook.restore(store.read_versioned(path, "costs", COSTS_VERSION, say) or {})
    except (ValueError, TypeError, AttributeError):
        return CostBook()


def save_costs(path: Path, costs: CostBook) -> None:
    """Keep the costs for the next process (``load_costs``)."""
    store.write_versioned(path, COSTS_VERSION, costs.snapshot())  # read-only: measured again
