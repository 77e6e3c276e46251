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
from specgen.core.speculative import DEFAULT_LOOKAHEAD
from specgen.engine import Finished, GenerationConfig, SpeculativeEngine, Stats, TextChunk
from specgen.errors import UserError
from specgen.fetch import cache_root, file_key
from specgen.registry import ModelSpec, PairSpec, Registry
from specgen.view import StreamView


@dataclass(frozen=True)
class Choice:
    """Which models a command runs, from --pair/--target/--draft and models.toml."""

    target: ModelSpec
    draft: ModelSpec | None
    pair: PairSpec | None

    @property
    def lookahead(self) -> int:
        return self.pair.lookahead if self.pair else DEFAULT_LOOKAHEAD

    @property
    def chat(self) -> bool:
        return self.pair.chat if self.pair else False


def choose(registry: Registry, pair: str | None, target: str | None, draft: str | None
           ) -> Choice:
    """A named pair (or the default one), with --target/--draft overriding its members.

    ``--target`` alone, with no pair, runs the target by itself.
    """
    named = registry.pair(pair) if pair or target is None else None
    target_spec = registry.spec(target) if target else named.target  # type: ignore[union-attr]
    draft_spec = registry.spec(draft) if draft else (named.draft if named else None)
    return Choice(target_spec, draft_spec, named)


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
    target: LlamaModel
    draft: LlamaModel | None

    def engine(self) -> SpeculativeEngine:
        return SpeculativeEngine(self.target, self.draft)


def load_pair(target: str | Path, draft: str | Path | None, options: PairOptions) -> Pair:
    """Load both models with the same context size, each with its own threads and GPU layers."""
    target_model = LlamaModel(
        _existing(target, "target"),
        ModelOptions(options.n_ctx, options.target_threads, options.target_gpu_layers),
        verbose=options.verbose,
    )
    if draft is None:
        return Pair(target_model, None)
    draft_model = LlamaModel(
        _existing(draft, "draft"),
        ModelOptions(target_model.n_ctx, options.draft_threads, options.draft_gpu_layers),
        verbose=options.verbose,
    )
    check_fit(target_model, draft_model)
    return Pair(target_model, draft_model)


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
) -> Result:
    """Generate, streaming text to stdout (when ``stream``) and live stats to stderr."""
    tokens = prompt_tokens(pair.target, prompt, chat, system)
    stats = Stats(lookahead=config.lookahead if pair.draft else 0, seed=config.seed or 0)
    pieces: list[str] = []
    interrupted = False
    with StreamView(stats, show_stats=show_stats) as view:
        try:
            for event in pair.engine().generate(tokens, config, stats):
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
