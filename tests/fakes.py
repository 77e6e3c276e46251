"""A scripted stand-in for a llama.cpp model: logits are a pure function of the cached prefix.

Because the logits hash the *whole* cache, a rollback that leaves a stale token behind changes
every later distribution, so the engine tests catch cache bugs without loading any weights.
Time is a ``FakeClock`` that the fake models advance as a real decode would take time, so what
``-k auto`` measures is exact and the same on every machine, and no test sleeps (but one that
signals a subprocess part-way, which needs fakes that take real time: ``wall_seconds``).

A fake also has what a loaded model shows of its vocabulary (tokenize, pieces, a chat template),
so the command line, batches, bench and the server run on it: ``write_fake`` writes a model file
that ``fake_backend`` loads as a fake, in this process (the ``fake_pair`` fixture swaps it in for
llama.cpp) or in a subprocess (``SPECGEN_BACKEND=tests.fakes:fake_backend``, which
``tests.invoke.specgen_process(..., fakes=True)`` sets).
"""

from __future__ import annotations

import copy
import json
import time
import zlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from specgen.core.coupling import PICK_TOGETHER_ROWS, Picking, pick_together
from specgen.core.sampling import SamplingParams, TopK, warp
from specgen.engine import CycleDone, Finished, TextChunk
from specgen.host.machine import default_threads

if TYPE_CHECKING:
    from specgen.backend import ModelOptions
    from specgen.checks import Facts, PairFacts
    from specgen.engine import GenerationConfig, SpeculativeEngine
    from specgen.session.loaded import Backend
    from specgen.stats import Stats

PIECES = [bytes([ord("a") + i]) for i in range(12)] + [b" ", b"\n", b"\xc3", b"\xa9"]
# A chat template in the Hugging Face style, as a GGUF carries one.
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


class FakeClock:
    """Seconds that pass only when a fake model decodes (or a test says so)."""

    def __init__(self) -> None:
        self.now = 0.0
        # CPUs "other processes" keep busy, as the fake backend's load meter reads it
        self.outside_load = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _picked(items, rows: list, pickings) -> list:
    """The items' rows, those that asked (``pickings``) picked together as the backend picks
    them (``backend.rows.pick_verifies``): by warp and k, where a group holds PICK_TOGETHER_ROWS."""
    groups: dict[tuple[SamplingParams, int], list[int]] = {}
    for j, picking in enumerate(pickings):
        got = rows[j]
        if picking is not None and isinstance(got, list) and got and items[j][0].warped is None:
            groups.setdefault((picking.params, len(got[0])), []).append(j)
    out = list(rows)
    for members in groups.values():
        if sum(len(rows[j]) for j in members) >= PICK_TOGETHER_ROWS:
            picked = pick_together([(rows[j], pickings[j]) for j in members])
            for j, got in zip(members, picked, strict=True):
                out[j] = got
    return out


class FakeModel:
    def __init__(
        self,
        n_vocab: int = 16,
        n_ctx: int = 512,
        salt: int = 0,
        noise: float = 0.0,
        sharpness: float = 2.0,
        eog: int | None = None,
        call_seconds: float = 0.0,
        token_seconds: float = 0.0,
        clock: FakeClock | None = None,
        path: Path = Path("fake.gguf"),
        n_threads: int = 1,
        chat_template: str | None = CHAT_TEMPLATE,
        repeat: int = 0,
        backend_sampling: bool = True,
        rows_on_device: bool = True,
        wall_seconds: float = 0.0,
        n_seq: int = 1,
        n_batch: int = 512,
    ) -> None:
        self.n_vocab, self.n_ctx = n_vocab, n_ctx
        # As a llama.cpp build with backend sampling: rows come back as their top-k when asked.
        self.backend_sampling, self.rows_on_device = backend_sampling, rows_on_device
        self.top_k = 0
        self.warped: SamplingParams | None = None
        # A real decode costs a fixed amount per call plus a little per token (a batch is cheap
        # per token): each decode advances ``clock`` so, which makes what the adaptive lookahead
        # measures meaningful.
        self.call_seconds, self.token_seconds = call_seconds, token_seconds
        # Real seconds a decode also waits: a subprocess that a test interrupts is still busy.
        self.wall_seconds = wall_seconds
        self.clock = clock if clock is not None else FakeClock()
        self.salt, self.noise, self.sharpness, self.eog = salt, noise, sharpness, eog
        self.path, self.n_threads, self.description = path, n_threads, "fake model"
        self.template = chat_template
        self.repeat = repeat  # > 0: the text mostly counts 0, 1, ... repeat-1 round and round
        self.cache: list[int] = []
        self.decode_calls: list[tuple[int, int]] = []
        self._rows: dict[tuple[int, ...], np.ndarray] = {}  # logits_after, as computed
        # Sequences of one context, as llama.cpp's (``backend.LlamaModel.sequence``): each a
        # fake with a cache of its own; a batch of them costs one decode of all their tokens.
        self.n_seq, self.n_batch, self.seq = n_seq, n_batch, 0
        self._views: dict[int, FakeModel] = {}
        self._gather = [None]  # shared with the views: who gathers decodes
        self.batches: list[list[tuple[int, int, int]]] = []  # (seq, tokens, rows) per batch

    def sequence(self, seq: int) -> FakeModel:
        assert 0 <= seq < self.n_seq, f"the context holds {self.n_seq} sequences"
        if seq == 0:
            return self
        if seq not in self._views:
            view = copy.copy(self)
            view.seq, view.cache, view.decode_calls = seq, [], []
            view.top_k, view.warped = 0, None
            self._views[seq] = view
        return self._views[seq]

    def gather(self, gather) -> None:
        self._gather[0] = gather

    def decode_together(self, items, pickings=None) -> list:
        """As ``LlamaModel.decode_together``, the rows of the items that asked (``pickings``)
        picked together where they are enough (``pick_together``, from their ``TopK`` rows)."""
        assert sum(len(t) for _, t, _ in items) <= self.n_batch, "one batch at most"
        assert len({m.seq for m, _, _ in items}) == len(items), "one item a sequence"
        self.batches.append([(m.seq, len(t), n) for m, t, n in items])
        self.clock.advance(
            self.call_seconds + self.token_seconds * sum(len(t) for _, t, _ in items)
        )
        if self.wall_seconds:
            time.sleep(self.wall_seconds)
        rows = [m._append(t, n) for m, t, n in items]
        return _picked(items, rows, pickings) if pickings else rows

    @property
    def n_past(self) -> int:
        return len(self.cache)

    def logits_after(self, prefix: list[int]) -> np.ndarray:
        """The logits this model gives for the token that follows ``prefix``."""
        base = self._gauss(prefix, 0)
        if self.noise:
            base = base + self.noise * self._gauss(prefix, self.salt)
        logits = (base * self.sharpness).astype(np.float32)
        if self.repeat and prefix:
            logits[(prefix[-1] + 1) % self.repeat] += 6.0
        return logits

    def _gauss(self, prefix: list[int], salt: int) -> np.ndarray:
        seed = zlib.crc32(np.asarray(prefix, dtype=np.int32).tobytes()) ^ (salt * 2654435761)
        return np.random.default_rng(seed & 0xFFFFFFFF).standard_normal(self.n_vocab)

    def sample_top_k(self, k: int, warped: SamplingParams | None = None) -> int:
        self.top_k = k if self.backend_sampling else 0
        # As llama.cpp's chain: the rest of the warp on the "backend" (final logits, -inf out).
        self.warped = warped if self.top_k and warped is not None and not warped.greedy else None
        return self.top_k

    def decode(
        self, tokens: list[int], n_logits: int = 1, picking: Picking | None = None
    ) -> np.ndarray | list[TopK]:
        assert 0 <= n_logits <= len(tokens), "logits can only be asked for decoded rows"
        assert self.n_past + len(tokens) <= self.n_ctx, "decode past the context"
        gather = self._gather[0]
        if gather is not None:
            return gather(self, tokens, n_logits, picking)
        self.clock.advance(self.call_seconds + self.token_seconds * len(tokens))
        if self.wall_seconds:
            time.sleep(self.wall_seconds)
        rows = self._append(tokens, n_logits)
        return (
            rows if picking is None else _picked([(self, tokens, n_logits)], [rows], [picking])[0]
        )

    def _append(self, tokens: list[int], n_logits: int) -> np.ndarray | list[TopK]:
        assert self.n_past + len(tokens) <= self.n_ctx, "decode past the context"
        self.decode_calls.append((len(tokens), n_logits))
        self.cache.extend(tokens)
        if n_logits == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        # Only the rows asked for are computed, as llama.cpp computes only the flagged ones.
        end = len(self.cache)
        rows = [self._row(self.cache[: end - n_logits + 1 + i]) for i in range(n_logits)]
        if self.top_k and self.warped is not None:
            return [_warped(TopK.of(row, self.top_k), self.warped) for row in rows]
        if self.top_k:
            return [TopK.of(row, self.top_k) for row in rows]
        return np.array(rows)

    def _row(self, prefix: list[int]) -> np.ndarray:
        """``logits_after(prefix)``, computed once per prefix (a pure function of it)."""
        key = tuple(prefix)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = self.logits_after(prefix)
        return row

    # An attention model's cache: cut anywhere, no checkpoint ever needed.
    rollback_anywhere = True
    recurrent = False

    @property
    def rollback_window(self) -> int:
        return self.n_ctx

    def keep_rollback_point(self, undo: int, one_decode: bool = True) -> None:
        """Nothing to keep: the cache is a list."""

    def constrain(self, grammar):
        """A fake's 16 pieces cannot spell JSON: structured output is tested on real models;
        here it is a user's error, as a model without the tokens would be."""
        from specgen.errors import UserError

        raise UserError("fake models have no grammar engine")

    def rollback(self, n_past: int) -> None:
        del self.cache[n_past:]

    def reset(self) -> None:
        self.cache.clear()

    def piece(self, token: int) -> bytes:
        return PIECES[token % len(PIECES)]

    def is_eog(self, token: int) -> bool:
        return token == self.eog

    # -- what a loaded model shows of its vocabulary (``backend.Vocabulary``) ------------------
    vocab_type = 2  # BPE
    bos = eos = -1  # none added: a prompt is its text alone
    adds_bos = adds_eos = False

    def token_text(self, token: int) -> bytes:
        return PIECES[token] if 0 <= token < len(PIECES) else b""

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        """A token per byte: the byte's own piece where there is one, else one of the letters."""
        return [
            PIECES.index(bytes([b])) if bytes([b]) in PIECES else b % 12
            for b in text.encode("utf-8")
        ]

    def chat_template(self) -> str | None:
        return self.template


class Generation(NamedTuple):
    """A generation driven to its end: every token its cycles gave (an end-of-generation token
    that stopped it included), the text it streamed, and how it finished."""

    cycle_tokens: list[int]
    text: str
    finished: Finished

    @property
    def tokens(self) -> list[int]:
        """The tokens it generated."""
        return self.cycle_tokens[: self.finished.stats.n_generated]

    @property
    def stats(self) -> Stats:
        return self.finished.stats


def drive(engine: SpeculativeEngine, config: GenerationConfig, prompt: Sequence[int]) -> Generation:
    """Drive the engine to the end of a generation (the one loop over its events tests have)."""
    tokens: list[int] = []
    text: list[str] = []
    for event in engine.generate(prompt, config):
        if isinstance(event, CycleDone):
            tokens.extend(event.tokens)
        elif isinstance(event, TextChunk):
            text.append(event.text)
    assert isinstance(event, Finished), "a generation always ends with Finished"
    return Generation(tokens, "".join(text), event)


def run_to_end(
    engine: SpeculativeEngine, config: GenerationConfig, prompt: Sequence[int]
) -> tuple[list[int], Stats]:
    """``drive``'s generated tokens and stats, as most tests unpack them."""
    done = drive(engine, config, prompt)
    return done.tokens, done.stats


def cpu_verify(n: int) -> float:
    """A CPU's verify pass of ``n`` tokens, in one-token passes: each token more costs 0.15 of
    one (a cost world for the lookahead policy, with no model behind it)."""
    return 1.0 + 0.15 * (n - 1)


def write_fake(path: Path, **params: object) -> Path:
    """A model file that ``load_fake`` loads as a ``FakeModel`` with these parameters."""
    path.write_text(json.dumps({"fake_model": params}))
    return path


def load_fake(
    path: Path, n_ctx: int, n_threads: int, clock: FakeClock, n_seq: int = 1
) -> FakeModel:
    """The fake a ``write_fake`` file describes, with the context, threads and sequences asked
    for."""
    params = json.loads(path.read_text())["fake_model"]
    return FakeModel(
        **{**params, "n_ctx": n_ctx or params.get("n_ctx", 512)},
        path=path,
        n_threads=n_threads or default_threads(),  # as llama.cpp's 0 does
        clock=clock,
        n_seq=n_seq,
    )


def fake_backend(clock: FakeClock | None = None) -> Backend:
    """A ``session.loaded.Backend`` that loads ``write_fake`` files as fakes, all on one fake
    clock (a new one if none is given): what ``SPECGEN_BACKEND=tests.fakes:fake_backend`` makes
    a subprocess run on."""
    from specgen.session.loaded import Backend

    clock = clock if clock is not None else FakeClock()

    def load(path: Path, options: ModelOptions, verbose: bool) -> FakeModel:
        return load_fake(path, options.n_ctx, options.n_threads, clock, options.n_seq)

    # Fakes run on this CPU whatever the build of llama.cpp could offload.
    return Backend(
        load, clock, load_meter=lambda: lambda: clock.outside_load, gpu_offload=lambda: False
    )


def machine_facts(*pairs: PairFacts, **changes: object) -> Facts:
    """A machine as ``checks.facts()`` (``specgen doctor``) describes one, for ``checks.advice``
    to read: 16 cores and as many threads, llama.cpp built for the CPU alone and passing the
    self-test, backend sampling on, no workers, these ``pairs``; ``changes`` over all that."""
    facts = {
        "llama_cpp_python": "0.3.36",
        "system_info": "CPU : AVX2 = 1",
        "cpu_features": ["AVX2"],
        "backends": ["CPU"],
        "gpu_offload": False,
        "nvidia_gpu_present": False,
        "cpu": "a test CPU",
        "cpu_lists_amx": False,
        "logical_cpus": 16,
        "physical_cores": 16,
        "default_threads": 16,
        "others_busy": 0.0,
        "self_test": {"ok": True, "message": "passed"},
        "caches": {},
        "pairs": list(pairs),
        "mtp_api": True,
        "backend_sampling": "on",
        "rpc": True,
        "workers": [],
        "hub": {"endpoint": "https://huggingface.co", "state": "reachable"},
    }
    return {**facts, **changes}  # type: ignore[return-value]


def pair_facts(**changes: object) -> PairFacts:
    """A pair as doctor describes one: ``p``, downloaded, with a draft model, nothing measured
    or benched yet; ``changes`` over that."""
    pair = {
        "name": "p",
        "downloaded": True,
        "host_share": {},
        "files": {},
        "bench": {},
        "draft_model": True,
        "target_layout": None,
        "rollback": {},
    }
    return {**pair, **changes}  # type: ignore[return-value]


def run_together(
    target: Any,
    drafts: Sequence[Any],
    drafter_of: Any,
    prompts: Sequence[Sequence[int]],
    lookaheads: Sequence[Any],
    source: str = "model",
    max_tokens: int = 30,
) -> tuple[dict[int, tuple[list[int], Stats]], Any]:
    """Greedy generations at once, sequence i of ``target``'s context on ``prompts[i]`` at
    ``lookaheads[i]``, drafting with ``drafter_of(i)``, through ``engine.streams`` as a batch
    runs them: each one's tokens and stats, and the streams (their statistics)."""
    from specgen.core.sampling import SamplingParams
    from specgen.engine import GenerationConfig, SpeculativeEngine
    from specgen.engine.streams import Streams
    from specgen.lookahead import BatchLoad, CostBook

    costs = CostBook()
    batch = BatchLoad(costs)
    streams = Streams(target, list(drafts), load=batch, source=source)
    done: dict[int, tuple[list[int], Stats]] = {}
    for i, (prompt, k) in enumerate(zip(prompts, lookaheads, strict=True)):
        engine = SpeculativeEngine(
            target.sequence(i), drafter_of(i), costs=costs, load=batch, slot=i
        )
        config = GenerationConfig(
            lookahead=k, sampling=SamplingParams(temperature=0.0), max_tokens=max_tokens
        )
        streams.add(
            lambda i=i, e=engine, c=config, p=prompt: done.__setitem__(i, run_to_end(e, c, p))
        )
    try:
        streams.run()
    finally:
        streams.close()
    return done, streams


def _warped(top: TopK, params: SamplingParams) -> TopK:
    """What llama.cpp's sampler chain gives for a row with the whole warp in it (the top-k's
    final logits, -inf outside q's support), read as ``backend.rows`` reads it."""
    q = warp(top, params)
    logits = np.full(len(top.ids), -np.inf, dtype=np.float32)
    inside = np.searchsorted(q.ids, top.ids).clip(max=len(q.ids) - 1)
    held = q.ids[inside] == top.ids
    logits[held] = np.log(q.probs[inside[held]]).astype(np.float32)
    return TopK.final(top.ids.tolist(), logits.tolist(), top.n_vocab, params)


def first_two_tally(
    engine: SpeculativeEngine,
    config: GenerationConfig,
    prompt: list[int],
    ids: list[int],
    source: str,
    n: int,
) -> tuple[np.ndarray, int]:
    """Over seeds 0..n-1 of ``config`` (three tokens each): how often each (first, second)
    pair came (rows: the first token's place in ``ids``), and in how many generations the
    first guess from ``source`` was rejected (the residual or the coupling's miss in use)."""
    counts, rejected = np.zeros((len(ids), engine.target.n_vocab)), 0
    place = {a: i for i, a in enumerate(ids)}
    for seed in range(n):
        tokens, stats = run_to_end(engine, replace(config, seed=seed, max_tokens=3), prompt)
        assert stats.coupling == config.rule()
        counts[place[tokens[0]], tokens[1]] += 1
        guessed = stats.by_source[source]
        rejected += guessed.accepted < min(guessed.drafted, 1)
    return counts, rejected
