"""The real ``run_one`` of a sweep: a bench session on a loaded pair.

An engine per way of drafting over the same loaded models, the prompts encoded once, the
adaptive rows starting from (and leaving) what ``-k auto`` knows of the pair on this machine;
the sweep per sampling setting, cut short cleanly by Ctrl-C; the reports with what they were
measured on.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from specgen.bench.report import BenchSetting, Report, summarize
from specgen.bench.sweep import Run, RunOne, sweep
from specgen.core.sampling import DEFAULT_SAMPLING, SamplingParams
from specgen.drafters import Drafter, Model, SuffixCache, make_drafter
from specgen.engine import Finished, GenerationConfig, SpeculativeEngine
from specgen.lookahead import CostBook
from specgen.models.arch import HEAD_NAMES
from specgen.session.generate import prompt_tokens, wants_chat
from specgen.session.memo import Variant
from specgen.session.pair import Pair
from specgen.session.remembered import save_costs
from specgen.stats import Stats
from specgen.structured.grammar import Grammar

if TYPE_CHECKING:
    from specgen.session.choice import Choice


class SweepWatcher(Protocol):
    """What shows a sweep's progress (the CLI's bar); told of each run as it starts."""

    def started(self, temperature: float, total: int) -> None: ...
    def running(self, repeat: int, prompt: int, variant: Variant) -> None: ...
    def ended(self) -> None: ...


class BenchSession:
    """One bench on a loaded pair: the prompts encoded once, an engine per way of drafting, and
    the costs ``-k auto`` knows of the pair here carried from run to run.

    Each adaptive run starts from what the runs before it learned (as every ``specgen run``
    after the first does); ``learned`` is what they leave, for the next process. Fixed K's start
    from nothing, which they do not read anyway.
    """

    def __init__(
        self,
        pair: Pair,
        choice: Choice,
        prompts: Sequence[str],
        kinds: Sequence[str] | None,
        variants: list[Variant],
        *,
        max_tokens: int,
        repeats: int,
        seed: int,
        prompts_file: Path | None = None,
        local_head: bool = True,
        grammars: Sequence[Grammar | None] | None = None,
    ) -> None:
        self.pair, self.choice, self.kinds, self.variants = pair, choice, kinds, variants
        self.max_tokens, self.repeats, self.seed = max_tokens, repeats, seed
        self.draft_p_min, self.clock = pair.draft_p_min, pair.clock
        self.prompts_file, self.local_head = prompts_file, local_head
        self.chat = wants_chat(pair, choice.chat, None, None)
        self.encoded = [prompt_tokens(pair.target, p, self.chat) for p in prompts]
        # What each prompt's answer must match, in every row (the target alone's too).
        self.grammars = list(grammars) if grammars else [None] * len(prompts)
        self.learned: CostBook = pair.costs
        # One drafter per way of drafting, over the same loaded models; each run begins afresh.
        ways = {
            "alone": (None, False),
            "ngram": (None, True),
            "model": (pair.draft, False),
            "auto": (pair.draft, False),
            "hybrid": (pair.draft, True),
            "cache": (pair.draft, True),
        }
        # The cache row's suffix cache: emptied at the first prompt of each repeat, so each of
        # its runs sees what the runs of the prompts before it (in this repeat) read and wrote.
        self.cache = SuffixCache()
        # With the target's own MTP head, the head is "the draft" of every row but ngram's.
        head = pair.head

        def drafter(way: str, draft: Model | None, ngram: bool) -> Drafter | None:
            guesses = head is not None and way not in ("alone", "ngram")
            return make_drafter(
                draft,
                ngram,
                self.draft_p_min,
                self.clock,
                head if guesses else None,
                pair.target,
                cache=self.cache if way == "cache" else None,
            )

        self._drafters: dict[str, Drafter | None] = {
            way: drafter(way, draft, ngram) for way, (draft, ngram) in ways.items()
        }

    def run_one(self, temperature: float) -> RunOne:
        """Runs at ``temperature`` with `specgen run`'s own sampling otherwise."""
        sampling = sampling_at(temperature)

        def run(prompt: int, variant: Variant, seed: int) -> Stats:
            way = "alone" if variant == 0 else variant if isinstance(variant, str) else "model"
            adaptive = isinstance(variant, str)
            if way == "cache" and prompt == 0:
                self.cache.clear()
            engine = SpeculativeEngine(
                self.pair.target,
                self._drafters[way],
                costs=self.learned.copy() if adaptive else CostBook(),
                clock=self.clock,
                busy=self.pair.busy,
            )
            config = GenerationConfig(
                lookahead="auto" if adaptive else int(variant),
                sampling=sampling,
                max_tokens=self.max_tokens,
                seed=seed,
                grammar=self.grammars[prompt],
                # what `run` does without a seed (the seed here only repeats the sample)
                coupling="residual",
            )
            meter = self.pair.load_meter() if self.pair.load_meter is not None else None
            for event in engine.generate(self.encoded[prompt], config):
                if isinstance(event, Finished):
                    if adaptive:
                        self.learned = engine.costs
                    event.stats.outside_load = meter() if meter is not None else None
                    return event.stats
            raise AssertionError("the engine always finishes")

        return run

    def measure(
        self, temperature: float, runs: list[Run], watcher: SweepWatcher | None = None
    ) -> None:
        """One sweep at one temperature, appending to ``runs`` as it goes."""
        run = self.run_one(temperature)
        adaptive = [k for k in self.variants if isinstance(k, str)]
        if adaptive and not self.learned.of(sampling_at(temperature).greedy).verify_by_n:
            # Nothing measured here yet: the warm-up learns the costs, as a first `specgen run`
            # would, so the rows show auto as every later run uses it.
            run(0, adaptive[0], self.seed)
        total = self.repeats * len(self.encoded) * (len(self.variants) + 1)
        if watcher is not None:
            watcher.started(temperature, total)
        try:
            sweep(
                run,
                len(self.encoded),
                self.variants,
                self.repeats,
                self.seed,
                watcher.running if watcher is not None else None,
                runs=runs,
            )
        finally:
            if watcher is not None:
                watcher.ended()

    def all(
        self, temperatures: Sequence[float], watcher: SweepWatcher | None = None
    ) -> tuple[list[Report], bool]:
        """A report per temperature; stops at Ctrl-C with the partial report of the one cut
        short (True: interrupted)."""
        reports: list[Report] = []
        for temperature in temperatures:
            runs: list[Run] = []
            try:
                self.measure(temperature, runs, watcher)
            except KeyboardInterrupt:
                partial = self.report(temperature, runs, partial=True)
                return reports + ([partial] if partial else []), True
            report = self.report(temperature, runs)
            assert report is not None, "a whole sweep has runs beside the target alone's"
            reports.append(report)
        return reports, False

    def report(self, temperature: float, runs: list[Run], partial: bool = False) -> Report | None:
        """What the runs at one temperature measured, with the setting (None: nothing beside
        the target alone ran)."""
        if not any(r.variant != 0 for r in runs):
            return None
        report = summarize(runs, self.kinds)
        setting = self.setting()
        where = f", target on {','.join(setting.workers)}" if setting.workers else ""
        report.temperature, report.sampling = temperature, sampling_params(temperature)
        report.partial, report.setting = partial, setting
        report.title = (
            f"{setting.name}, {_threads(self.pair.target.n_threads)}{where}, "
            f"T={temperature}" + (" (partial: interrupted)" if partial else "")
        )
        return report

    def setting(self) -> BenchSetting:
        """What this bench runs on and with: the models, its parameters, the machine."""
        from specgen import backend
        from specgen.host.machine import cpu_name

        pair, choice = self.pair, self.choice
        target, draft = pair.target, pair.draft
        name = choice.pair.name if choice.pair else target.path.name
        return BenchSetting(
            name=name,
            pair=choice.pair.name if choice.pair else None,
            target={
                "spec": choice.target.label(),
                "file": str(target.path),
                "size_bytes": target.path.stat().st_size,
                "description": target.description,
                "workers": list(choice.workers),
                "local_head": self.local_head,
            },
            draft={"spec": "mtp", "description": "the target's own MTP head"}
            if self.pair.mtp
            else {
                "spec": f"{self.pair.head_kind}:{choice.draft.label()}",
                "description": f"{HEAD_NAMES.get(self.pair.head_kind or '', 'a head')} beside "
                "the target",
            }
            if self.pair.head is not None and choice.draft is not None
            else None
            if draft is None or choice.draft is None
            else {
                "spec": choice.draft.label(),
                "file": str(draft.path),
                "size_bytes": draft.path.stat().st_size,
                "description": draft.description,
            },
            params={
                "lookaheads": self.variants,
                "draft_p_min": self.draft_p_min,
                "max_tokens": self.max_tokens,
                "prompt_kinds": self.kinds,
                "repeats": self.repeats,
                "seed": self.seed,
                "prompts": len(self.encoded),
                "prompts_file": str(self.prompts_file) if self.prompts_file else None,
                "constrained_prompts": sum(g is not None for g in self.grammars),
                "chat": self.chat,
                "n_ctx": target.n_ctx,
            },
            machine={
                "platform": platform.platform(),
                "python": platform.python_version(),
                "cpu": cpu_name(),
                "logical_cpus": os.cpu_count(),
                "target_threads": target.n_threads,
                "draft_threads": draft.n_threads if draft else None,
                "gpu_offload": backend.supports_gpu_offload(),
                "llama_cpp_python": backend.library_version(),
                "llama_cpp_system_info": backend.system_info(),
            },
            workers=choice.workers,
            local_head=self.local_head,
        )

    def remember_costs(self) -> None:
        """Leave what the adaptive rows learned for the next process on these models."""
        learned = self.learned
        if self.pair.costs_file is not None and (
            learned.greedy.verify_by_n or learned.sampled.verify_by_n
        ):
            save_costs(self.pair.costs_file, learned)


def sampling_at(temperature: float) -> SamplingParams:
    """`specgen run`'s default sampling at another temperature (0: greedy)."""
    return replace(DEFAULT_SAMPLING, temperature=temperature)


def sampling_params(temperature: float) -> dict[str, object]:
    """The sampling a bench at ``temperature`` ran with, as its JSON ``params`` say it."""
    if SamplingParams(temperature=temperature).greedy:
        return {"temperature": temperature}
    return {
        "temperature": temperature,
        "top_k": DEFAULT_SAMPLING.top_k,
        "top_p": DEFAULT_SAMPLING.top_p,
        "min_p": DEFAULT_SAMPLING.min_p,
    }


def _threads(n: int) -> str:
    return f"{n} thread" + ("" if n == 1 else "s")
