"""Loading a target/draft pair and running one generation with the live view.

This is the glue shared by ``specgen run`` and ``specgen bench``: build the prompt's tokens
(with the chat template when asked), drive the engine, stream its text, survive Ctrl-C.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specgen import compat
from specgen.backend import LlamaModel, ModelOptions, Vocabulary
from specgen.chat import render_chat
from specgen.core.speculative import DEFAULT_LOOKAHEAD, Lookahead
from specgen.drafters import Drafter, HybridDrafter, ModelDrafter, NgramDrafter
from specgen.engine import Finished, GenerationConfig, SpeculativeEngine, Stats, TextChunk
from specgen.errors import UserError
from specgen.fetch import cache_root, file_key
from specgen.registry import NGRAM, ModelSpec, PairSpec, Registry
from specgen.view import StreamView


@dataclass(frozen=True)
class Choice:
    """Which models a command runs, from --pair/--target/--draft and models.toml.

    ``ngram`` drafts by prompt lookup: alone where ``draft`` is None, else beside the draft model.
    """

    target: ModelSpec
    draft: ModelSpec | None
    pair: PairSpec | None
    ngram: bool = False

    @property
    def lookahead(self) -> Lookahead:
        return self.pair.lookahead if self.pair else DEFAULT_LOOKAHEAD

    @property
    def chat(self) -> bool:
        return self.pair.chat if self.pair else False

    @property
    def drafts(self) -> bool:
        return self.draft is not None or self.ngram


def choose(registry: Registry, pair: str | None, target: str | None, draft: str | None,
           ngram: bool | None = None) -> Choice:
    """A named pair (or the default one), with --target/--draft overriding its members.

    ``--target`` alone, with no pair, runs the target by itself; ``--draft ngram`` drafts by
    prompt lookup; ``ngram`` (``--ngram/--no-ngram``) adds or removes prompt lookup beside a
    draft model, where None keeps the pair's own setting.
    """
    named = registry.pair(pair) if pair or target is None else None
    target_spec = registry.spec(target) if target else named.target  # type: ignore[union-attr]
    if draft == NGRAM:
        return Choice(target_spec, None, named, ngram=True)
    draft_spec = registry.spec(draft) if draft else (named.draft if named else None)
    by_pair = named.ngram if named else False
    return Choice(target_spec, draft_spec, named, by_pair if ngram is None else ngram)


def check_fit(target: Vocabulary, draft: Vocabulary) -> None:
    """Refuse a draft whose vocabulary does not fit the target (result cached per file pair)."""
    stamp = cache_root() / "compat" / file_key(target.path, draft.path)
    if stamp.is_file():
        return
    verdict = compat.check(target, draft)
    if not verdict:
        raise UserError(f"draft {draft.path.name} cannot serve target {target.path.name}: "
                        f"{verdict.reason}; pick a draft from the target's model family")
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(f"{target.path}\n{draft.path}\n")


@dataclass(frozen=True)
class PairOptions:
    """Per-model runtime settings; thread counts of 0 mean llama.cpp's default."""

    n_ctx: int = 0
    target_threads: int = 0
    draft_threads: int = 0
    target_gpu_layers: int = -1
    draft_gpu_layers: int = -1
    verbose: bool = False


@dataclass
class Pair:
    """Loaded models; ``ngram`` drafts by prompt lookup (alone, or beside the draft model)."""

    target: LlamaModel
    draft: LlamaModel | None
    ngram: bool = False

    def drafter(self, draft_p_min: float = 0.0) -> Drafter | None:
        if self.draft is None:
            return NgramDrafter() if self.ngram else None
        model = ModelDrafter(self.draft, draft_p_min)
        return HybridDrafter(model) if self.ngram else model

    def engine(self, draft_p_min: float = 0.0) -> SpeculativeEngine:
        return SpeculativeEngine(self.target, self.drafter(draft_p_min))


def bench_engines(pair: Pair, draft_p_min: float = 0.0) -> dict[str, SpeculativeEngine]:
    """One engine per way of drafting that bench compares, all over the same loaded models:
    ``alone`` (no drafter), ``model`` (fixed K's), ``auto``, ``ngram`` and ``hybrid``."""
    engines = {"alone": SpeculativeEngine(pair.target),
               "ngram": SpeculativeEngine(pair.target, NgramDrafter())}
    if pair.draft is not None:
        model = ModelDrafter(pair.draft, draft_p_min)
        engines["model"] = engines["auto"] = SpeculativeEngine(pair.target, model)
        engines["hybrid"] = SpeculativeEngine(pair.target, HybridDrafter(model))
    return engines


def load_pair(target: str | Path, draft: str | Path | None, options: PairOptions,
              ngram: bool = False) -> Pair:
    """Load both models with the same context size, each with its own threads and GPU layers."""
    target_model = LlamaModel(
        _existing(target, "target"),
        ModelOptions(options.n_ctx, options.target_threads, options.target_gpu_layers),
        verbose=options.verbose,
    )
    if draft is None:
        return Pair(target_model, None, ngram)
    draft_model = LlamaModel(
        _existing(draft, "draft"),
        ModelOptions(target_model.n_ctx, options.draft_threads, options.draft_gpu_layers),
        verbose=options.verbose,
    )
    check_fit(target_model, draft_model)
    return Pair(target_model, draft_model, ngram)


def _existing(path: str | Path, role: str) -> Path:
    resolved = Path(path).expanduser()
    if not resolved.is_file():
        raise UserError(f"{role} model not found: {resolved} (give the path of a .gguf file)")
    return resolved


def prompt_tokens(model: LlamaModel, text: str, chat: bool, system: str | None = None
                  ) -> list[int]:
    """The prompt as the target's tokens, wrapped in its chat template when ``chat`` is set."""
    if chat:
        text = render_chat(model.chat_template(), text, system,
                           bos_token=model.token_text(model.bos).decode("utf-8", "replace"),
                           eos_token=model.token_text(model.eos).decode("utf-8", "replace"))
    elif system:
        raise UserError("--system needs --chat (a system message only exists in a chat)")
    tokens = model.tokenize(text, add_special=True, parse_special=True)
    # Templates often write the BOS text themselves; tokenizing then adds a second one.
    if len(tokens) >= 2 and tokens[0] == tokens[1] == model.bos and model.adds_bos:
        tokens = tokens[1:]
    return tokens


@dataclass
class Result:
    text: str
    stats: Stats
    interrupted: bool = False


def generate_text(
    pair: Pair, prompt: str, config: GenerationConfig, chat: bool = False,
    system: str | None = None, show_stats: bool = True, stream: bool = True,
    draft_p_min: float = 0.0,
) -> Result:
    """Generate, streaming text to stdout (when ``stream``) and live stats to stderr."""
    tokens = prompt_tokens(pair.target, prompt, chat, system)
    engine = pair.engine(draft_p_min)
    stats = Stats(lookahead=config.lookahead if engine.drafter else 0, seed=config.seed or 0,
                  speculative=engine.drafter is not None)
    pieces: list[str] = []
    interrupted = False
    with StreamView(stats, show_stats=show_stats) as view:
        try:
            for event in engine.generate(tokens, config, stats):
                if isinstance(event, TextChunk):
                    pieces.append(event.text)
                    if stream:
                        view.write(event.text)
                elif isinstance(event, Finished):
                    break
        except KeyboardInterrupt:
            interrupted = True
            stats.finish("interrupted")
    if stats.stop_reason == "context_full":
        view.console.print(f"stopped: the context window ({pair.target.n_ctx} tokens) is full; "
                           f"raise --ctx-size for longer generations", style="yellow",
                           highlight=False, soft_wrap=True)
    return Result("".join(pieces), stats, interrupted)
