"""Which models, K and way of drafting a command runs: one decision for every command.

``specgen run``, batches, ``bench``, the Python API and ``serve`` all decide here, from the
model options, ``models.toml`` (``specgen.session.choice``) and what ``specgen bench`` found on
this machine (``specgen.session.memo``); where they differ, the difference is a parameter of
``decide``. Nothing is downloaded or loaded here (``specgen.session.pair`` does that).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specgen.lookahead import Lookahead, effective_lookahead
from specgen.models.registry import NGRAM, ModelSpec, Registry
from specgen.session import memo
from specgen.session.choice import Choice, choose


@dataclass(frozen=True)
class Decision:
    """What a command runs: the models, K (0: the target alone; or "auto"), prompt lookup, and
    where that K came from (``note``, said on stderr) and where bench's findings for these
    models on this machine are kept (``memo``)."""

    choice: Choice
    lookahead: Lookahead
    note: str
    memo: Path
    keep_draft: bool = False  # load the draft even at K=0 (bench runs every K on one pair)

    @property
    def draft(self) -> ModelSpec | None:
        """The draft model to load: none where the target runs alone (unless ``keep_draft``)."""
        return self.choice.draft if self.lookahead != 0 or self.keep_draft else None

    @property
    def ngram(self) -> bool:
        """Whether the loaded pair drafts by prompt lookup (alone or beside the draft model)."""
        return self.choice.ngram and self.lookahead != 0

    @property
    def mtp(self) -> bool:
        """Whether the loaded target drafts with its own MTP head."""
        return self.choice.mtp and (self.lookahead != 0 or self.keep_draft)

    @property
    def chat(self) -> bool | None:
        return self.choice.chat

    @property
    def name(self) -> str | None:
        return self.choice.pair.name if self.choice.pair else None


ALONE_NOTE = "no draft model: running the target alone (-k 0; --draft ngram drafts without one)"


def decide(
    pair: str | None = None,
    target: str | None = None,
    draft: str | None = None,
    *,
    ngram: bool | None = None,
    mtp: bool | None = None,
    lookahead: Lookahead | None = None,
    rpc: str | None = None,
    threads: int = 0,
    gpu_layers: int = -1,
    bench_temperature: float | None = None,
    explain_alone: bool = False,
    keep_draft: bool = False,
    registry: Registry | None = None,
) -> Decision:
    """The one decision of which models, K and drafting a command runs.

    K is ``lookahead`` where given, else what ``specgen bench`` found best for these models on
    this machine (threads, GPU layers) at ``bench_temperature``'s kind of sampling (None: bench
    is not asked; nor is it where ``--ngram/--no-ngram`` or ``--draft ngram`` says how to draft),
    else the pair's own, else DEFAULT_LOOKAHEAD; and 0 where nothing drafts
    (``explain_alone``: the note says so when another K was asked for). ``keep_draft`` loads
    the draft model whatever K is (bench measures every K on one loaded pair).
    """
    choice = choose(registry or Registry.load(), pair, target, draft, ngram, rpc, mtp)
    found = memo.memo_path(choice, threads, gpu_layers)
    note = ""
    if bench_temperature is not None and lookahead is None and ngram is None and draft != NGRAM:
        picked = memo.recall_choice(choice, found, bench_temperature)
        if picked is not None:
            choice, lookahead, note = picked
    k = choice.lookahead if lookahead is None else lookahead
    if not choice.drafts and k != 0 and not note and explain_alone:
        note = ALONE_NOTE
    return Decision(choice, effective_lookahead(k, choice.drafts), note, found, keep_draft)
