"""The sweep: every prompt at K=0 and at each K or way of drafting, interleaved.

The runs are interleaved (K=0, K1, K2, ... for a prompt, then the next prompt, then again) so a
machine whose speed drifts does not bias the ratios, and every run starts from empty caches.
``sweep`` drives a ``run_one`` callable and keeps the ``Stats`` it returns, so tests feed it
fakes; ``specgen.bench.runner`` is the real one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specgen.errors import UserError
from specgen.lookahead import MAX_LOOKAHEAD
from specgen.session.memo import NAMED_VARIANTS, Variant
from specgen.stats import Stats

# What bench measures beside fixed K's: the draft model with -k auto, prompt lookup alone, both
# together, and both with the suffix cache of the prompts run before in the same repeat (as a
# server or a batch sees them; each with -k auto), in this order after the K's.
ADAPTIVE_VARIANTS = NAMED_VARIANTS
DEFAULT_VARIANTS = "1,2,3,4,6,8,auto,ngram,hybrid,cache"
# The rows that draft with no draft model (a target alone can still run them).
LOOKUP_VARIANTS: tuple[Variant, ...] = ("ngram", "cache")


def parse_lookaheads(text: str) -> list[Variant]:
    """Fixed K's (sorted) then the adaptive variants asked for, each once; K=0 always runs."""
    ks: set[int] = set()
    named: set[str] = set()
    for item in (v.strip().lower() for v in text.split(",")):
        if not item:
            continue
        if item in ADAPTIVE_VARIANTS:
            named.add(item)
            continue
        try:
            ks.add(int(item))
        except ValueError as err:
            raise UserError(
                f"-k takes K's and {', '.join(ADAPTIVE_VARIANTS)} separated by "
                f"commas, like 1,2,4,8,auto (got {text!r})"
            ) from err
    ks.discard(0)
    if (ks and (min(ks) < 0 or max(ks) > MAX_LOOKAHEAD)) or not (ks or named):
        raise UserError(
            f"-k needs at least one K from 1 to {MAX_LOOKAHEAD} or one of "
            f"{', '.join(ADAPTIVE_VARIANTS)} (the target alone always runs)"
        )
    return [*sorted(ks), *(v for v in ADAPTIVE_VARIANTS if v in named)]


def variant_order(variant: Variant) -> tuple[int, int]:
    if isinstance(variant, int):
        return (0, variant)
    return (1, ADAPTIVE_VARIANTS.index(variant))


@dataclass(frozen=True)
class Run:
    """One measured generation."""

    variant: Variant
    prompt: int
    repeat: int
    stats: Stats

    @property
    def tokens_per_second(self) -> float:
        return self.stats.n_generated / self.stats.gen_seconds if self.stats.gen_seconds else 0.0


RunOne = Callable[[int, Variant, int], Stats]  # (prompt index, K or variant, seed) -> Stats


def sweep(
    run_one: RunOne,
    n_prompts: int,
    variants: Sequence[Variant],
    repeats: int,
    seed: int,
    on_run: Callable[[int, int, Variant], None] | None = None,
    warmup: bool = True,
    runs: list[Run] | None = None,
) -> list[Run]:
    """Every prompt at K=0 and each K or variant, interleaved, ``repeats`` times; a warm-up
    run first (the largest K, else the first variant). Runs are appended to ``runs`` as they
    finish, so a sweep cut short by Ctrl-C leaves what it measured there."""
    rows: list[Variant] = [0, *variants]
    if warmup:
        fixed = [k for k in variants if isinstance(k, int)]
        run_one(0, max(fixed) if fixed else variants[0], seed)
    runs = [] if runs is None else runs
    for repeat in range(repeats):
        for prompt in range(n_prompts):
            for variant in rows:
                if on_run:
                    on_run(repeat, prompt, variant)
                runs.append(Run(variant, prompt, repeat, run_one(prompt, variant, seed + repeat)))
    return runs
