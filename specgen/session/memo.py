"""What ``specgen bench`` found best for a pair on this machine, remembered for ``run`` and
``serve``: one record per models and machine (CPU, llama.cpp build, threads, GPU layers,
workers), a verdict per kind of sampling (greedy, sampled).

It is also the one home of what a bench row (a *variant*: a fixed K, ``auto``, ``ngram`` or
``hybrid``) means as a choice of drafting (``variant_choice``) and as ``specgen run`` options
(``variant_options``).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from specgen.core.sampling import SamplingParams
from specgen.host import store
from specgen.host.machine import build_id, cpu_flags, default_threads
from specgen.lookahead import Lookahead, check_lookahead
from specgen.session.choice import Choice

# A row of a bench: a fixed K of the draft model, or one of the adaptive variants (``auto``, the
# draft model with K chosen each cycle; ``ngram``, prompt lookup alone; ``hybrid``, both).
Named = Literal["auto", "ngram", "hybrid", "cache"]
Variant = int | Named
# The adaptive rows, in the order a bench runs them after the K's.
NAMED_VARIANTS: tuple[Named, ...] = ("auto", "ngram", "hybrid", "cache")
# The memo file's format (``store.write_versioned``): one verdict per sampling mode, its keys
# those ``remember`` writes. Another number is set aside.
MEMO_VERSION = 1
# Beside the modes' verdicts: what ``bench --streams`` found best (``remember_streams``).
STREAMS = "streams"


def memo_path(choice: Choice, threads: int, gpu_layers: int) -> Path:
    """Where ``specgen bench`` keeps, and ``specgen run`` finds, what was measured for these
    models on this machine with these threads and GPU layers."""
    machine: dict[str, object] = {
        "cpu": platform.processor() or platform.machine(),
        "flags": cpu_flags(),
        "logical_cpus": os.cpu_count(),
        "build": build_id(),
        "threads": threads or default_threads(),
        "gpu_layers": gpu_layers,
    }
    if choice.workers:  # a verify over the network costs otherwise: K is measured apart
        machine["workers"] = list(choice.workers)
    key = store.text_key(json.dumps(machine, sort_keys=True, default=str))
    return store.path("bench", f"{_models_key(choice)}-{key}")


def _models_key(choice: Choice) -> str:
    """The part of a memo's name that names the models (the rest: the machine and settings)."""
    draft = choice.draft.label() if choice.draft else "mtp" if choice.mtp else "-"
    if choice.head and choice.draft:
        draft = f"{choice.head}:{draft}"
    return store.text_key(json.dumps([choice.target.label(), draft]))


def found_for(choice: Choice) -> dict[str, dict[str, object]]:
    """What bench last found for these models on this machine, with whatever threads, GPU
    layers or workers it ran (``doctor`` shows it): the newest memo's findings by mode."""
    kept = store.newest("bench", f"{_models_key(choice)}-")
    return found_here(kept) if kept is not None else {}


def mode_of(temperature: float) -> str:
    """The kind of sampling a verdict is kept under."""
    return "greedy" if SamplingParams(temperature=temperature).greedy else "sampled"


@dataclass(frozen=True)
class Finding:
    """What one bench (one kind of sampling) found best: the variant (0: nothing paid), its
    speedup over the target alone and its cost ratio (a draft step over a target step)."""

    temperature: float
    variant: Variant = 0
    speedup: float = 1.0
    cost_ratio: float | None = None


# The least a bench must measure before it changes run's defaults: a few prompts (one prompt's
# acceptance says little of another's) and some hundreds of tokens a row.
MIN_PROMPTS, MIN_TOKENS = 3, 256


def too_small(prompts: int, repeats: int, max_tokens: int) -> str | None:
    """Why a bench of this size is too small to remember (None: large enough)."""
    runs = prompts * repeats
    if runs >= MIN_PROMPTS and runs * max_tokens >= MIN_TOKENS:
        return None
    return (
        f"{runs} run{'s' if runs != 1 else ''} of {max_tokens} tokens a row is too small a "
        f"sample to change run's defaults (at least {MIN_PROMPTS} prompts and {MIN_TOKENS} "
        f"tokens a row); nothing remembered"
    )


def forget(choice: Choice) -> list[Path]:
    """Drop what bench found for these models on this machine, at any threads, GPU layers or
    workers; the files removed."""
    folder = store.path("bench", "x").parent
    removed = sorted(folder.glob(f"{_models_key(choice)}-*.json")) if folder.is_dir() else []
    for found in removed:
        found.unlink(missing_ok=True)
    return removed


def remember(path: Path, findings: Sequence[Finding], when: str) -> None:
    """Keep each sampling mode's best variant for `run` to use by default."""
    memo = _read(path)
    for found in findings:
        memo[mode_of(found.temperature)] = {
            "variant": found.variant,
            "speedup": found.speedup,
            "temperature": found.temperature,
            "date": when,
            "cost_ratio": found.cost_ratio,
        }
    store.write_versioned(path, MEMO_VERSION, memo, indent=1)  # read-only: nothing remembered


def recall(path: Path, temperature: float) -> dict[str, object] | None:
    """What bench found for this sampling mode, or None when it never ran here."""
    found = found_here(path).get(mode_of(temperature))
    return found if isinstance(found, dict) and "variant" in found else None


def remember_streams(path: Path, parallel: int, tokens_per_second: float, when: str) -> None:
    """Keep how many streams at once gave the most tokens per second (``bench --streams``),
    for ``serve`` to open that many slots by default."""
    memo = _read(path)
    memo[STREAMS] = {"parallel": parallel, "tokens_per_second": tokens_per_second, "date": when}
    store.write_versioned(path, MEMO_VERSION, memo, indent=1)  # read-only: nothing remembered


def recall_parallel(path: Path) -> tuple[int, str] | None:
    """The streams at once ``bench --streams`` found best for these models here, and a note
    that says so; None where it never measured them."""
    found = _read(path).get(STREAMS)
    if not isinstance(found, dict):
        return None
    parallel, speed = found.get("parallel"), found.get("tokens_per_second")
    if not isinstance(parallel, int) or not 1 <= parallel <= 64:
        return None
    rate = f", {speed:.1f} tok/s" if isinstance(speed, int | float) else ""
    note = (
        f"--parallel {parallel}: what `specgen bench --streams` found best here "
        f"({found.get('date')}{rate}); --parallel to choose"
    )
    return parallel, note


def found_here(path: Path) -> dict[str, dict[str, object]]:
    """Everything bench found at ``path``, by sampling mode (``doctor`` shows it): nothing
    where it never ran here, or left a file of another format (said in one line)."""
    return {
        mode: found
        for mode, found in _read(path).items()
        if mode != STREAMS and isinstance(found, dict)
    }


def _read(path: Path) -> dict[str, object]:
    return store.read_versioned(path, "bench memo", MEMO_VERSION) or {}


def variant_name(variant: object) -> str:
    """How a row is named to a user: ``K=4``, ``auto``, ``ngram``, ``hybrid``."""
    return f"K={variant}" if isinstance(variant, int) else str(variant)


def variant_choice(choice: Choice, variant: object) -> tuple[Choice, Lookahead] | None:
    """The choice and K that run a bench row on these models (None: not a row bench makes)."""
    if variant == "ngram":
        return replace(choice, draft=None, mtp=False, ngram=True), "auto"
    if variant in ("hybrid", "cache"):  # the cache comes with prompt lookup
        return replace(choice, ngram=True), "auto"
    try:
        return replace(choice, ngram=False), check_lookahead(variant)
    except ValueError:
        return None


def recall_choice(
    choice: Choice, path: Path, temperature: float
) -> tuple[Choice, Lookahead, str] | None:
    """What `specgen bench` found best for these models here at this kind of sampling, as the
    choice to use, its K and a note that says where the K came from; None where bench never ran
    here (or the choice drafts nothing, so there is nothing to pick)."""
    if not choice.drafts:
        return None
    found = recall(path, temperature)
    picked = None if found is None else variant_choice(choice, found["variant"])
    if found is None or picked is None:
        return None
    speedup = found.get("speedup", 1.0)
    times = float(speedup) if isinstance(speedup, int | float) else 1.0
    note = (
        f"{variant_name(found['variant'])}: what `specgen bench` found best here "
        f"({found.get('date')}, {times:.2f}x at T={found.get('temperature')}); "
        f"-k to choose another"
    )
    return (*picked, note)


def variant_options(
    variant: Variant,
    pair: str | None,
    target: Path | None,
    draft: Path | None,
    mtp: bool = False,
) -> str:
    """The `specgen run` options that reproduce one bench row (``mtp``: the target's head
    drafts)."""
    if pair:
        models = f"--pair {pair}"
    else:
        models = f"--target {shlex.quote(str(target))}"
        if draft is not None and variant != "ngram":
            models += f" --draft {shlex.quote(str(draft))}"
        elif mtp and variant != "ngram":
            models += " --draft mtp"
    if variant == "ngram":
        return f"{models} --draft ngram -k auto"
    if variant in ("hybrid", "cache"):
        return f"{models} --ngram -k auto"
    return f"{models} --no-ngram -k {variant}"
