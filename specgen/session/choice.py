"""Which models a command runs: from --pair/--target/--draft/--rpc and ``models.toml``.

``choose`` is the one home of that choice; ``specgen.session.decide`` adds K and what bench
found. Nothing is downloaded or loaded here (``specgen.session.pair`` does that); the workers a
choice names are probed, since ggml would abort the process on one that does not answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from specgen.errors import UsageError
from specgen.host.rpc import parse_endpoints, probe
from specgen.lookahead import DEFAULT_LOOKAHEAD, Lookahead
from specgen.models.registry import (
    HYBRID_BY_DEFAULT,
    MTP,
    NGRAM,
    ModelSpec,
    PairSpec,
    Registry,
    cached,
    head_prefix,
)


@dataclass(frozen=True)
class Choice:
    """Which models a command runs, from --pair/--target/--draft and models.toml.

    ``ngram`` drafts by prompt lookup: alone where ``draft`` is None and not ``mtp``, else beside
    the draft model or the target's own MTP head (``mtp``). ``head`` says the draft file is an
    EAGLE3 or DFlash head (``--draft eagle3:FILE``); a file of that architecture is one
    whatever is said (``session.fit.check_head``).
    """

    target: ModelSpec
    draft: ModelSpec | None
    pair: PairSpec | None
    ngram: bool = False
    workers: tuple[str, ...] = ()  # where the target's layers go (`specgen worker`s)
    mtp: bool = False
    head: str | None = None

    @property
    def lookahead(self) -> Lookahead:
        return self.pair.lookahead if self.pair else DEFAULT_LOOKAHEAD

    @property
    def chat(self) -> bool | None:
        """The pair's ``chat`` setting; None: decided by the target's chat template."""
        return self.pair.chat if self.pair else None

    @property
    def drafts(self) -> bool:
        return self.draft is not None or self.ngram or self.mtp


def choose(
    registry: Registry,
    pair: str | None,
    target: str | None,
    draft: str | None,
    ngram: bool | None = None,
    rpc: str | None = None,
    mtp: bool | None = None,
) -> Choice:
    """The models a command runs. The rule, as the README states it:

    - ``--pair NAME``, or no model option at all (the default pair): both models of the pair;
    - ``--target``/``--draft`` next to ``--pair`` replace that member of the pair;
    - ``--target`` with no ``--pair``: your target, alone or with your ``--draft``;
    - ``--draft`` with no ``--pair`` and no ``--target``: a usage error (whose target?).

    ``--draft ngram`` drafts by prompt lookup; ``ngram`` (``--ngram/--no-ngram``) adds or
    removes prompt lookup beside a draft model, where None keeps the pair's own setting.
    ``--draft mtp`` (or ``mtp=True``, ``--mtp``) drafts with the target's own MTP head; with no
    draft model, a target whose GGUF (on disk already) has MTP layers drafts with them unless
    ``mtp=False`` (``--no-mtp``).
    ``--draft eagle3:FILE`` / ``dflash:FILE`` drafts with that head (``FILE`` any model spec).
    ``rpc`` (``host:port,...``, or ``none``) names the workers for the target's layers, where
    None keeps the pair's own.
    """
    if draft is not None and target is None and pair is None:
        raise UsageError(
            "--draft needs a target: add --target FILE, or --pair NAME to use "
            "the draft with that pair's target"
        )
    named = registry.pair(pair) if pair or target is None else None
    if target:
        target_spec = registry.spec(target)
    else:
        assert named is not None, "no --target means a pair (the default one at least)"
        target_spec = named.target
    workers = _pair_workers(rpc, named)
    if draft == NGRAM:
        return Choice(target_spec, None, named, ngram=True, workers=workers)
    if draft == MTP:
        if mtp is False:
            raise UsageError("--draft mtp and --no-mtp say opposite things: drop one")
        draft, mtp = None, True
    elif draft is not None and mtp:
        raise UsageError("--mtp drafts with the target's own head: drop --draft, or --mtp")
    by_pair = named.ngram if named else HYBRID_BY_DEFAULT
    with_ngram = by_pair if ngram is None else ngram
    # A pair that drafts with its target's head, unless --target brings another target.
    pair_mtp = named is not None and named.mtp and target is None
    if draft is None and (mtp or (pair_mtp and mtp is None)):
        return Choice(target_spec, None, named, with_ngram, workers, mtp=True)
    head, draft = head_prefix(draft) if draft else (None, draft)
    if draft:
        draft_spec: ModelSpec | None = registry.spec(draft)
    else:
        draft_spec = named.draft if named else None
        head = named.head if named else None
    if draft_spec is None and mtp is None and has_mtp(target_spec):
        return Choice(target_spec, None, named, with_ngram, workers, mtp=True)
    return Choice(target_spec, draft_spec, named, with_ngram, workers, head=head)


def has_mtp(spec: ModelSpec) -> bool:
    """Whether a model's GGUF, where it is on disk already, carries MTP layers (llama.cpp's
    rule: the tensor ``blk.{N-1}.nextn.eh_proj.weight``)."""
    from specgen.models import arch, gguf

    path = cached(spec)
    if path is None:
        return False
    try:
        return arch.layout(gguf.read_local(str(path), tensors=True)).mtp_layers > 0
    except (OSError, gguf.GGUFError):
        return False


def _pair_workers(rpc: str | None, pair: PairSpec | None) -> tuple[str, ...]:
    """The workers named, checked before anything is downloaded or loaded: this build has RPC,
    and each worker answers the handshake (ggml would abort the process otherwise)."""
    if rpc is None:
        workers = pair.workers if pair else ()
    elif rpc.strip().lower() == "none":
        workers = ()
    else:
        workers = tuple(str(endpoint) for endpoint in parse_endpoints(rpc))
    if workers:
        from specgen.backend import require_rpc

        require_rpc()
        probe(parse_endpoints(workers))
    return workers
