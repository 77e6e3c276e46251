"""Command-line options shared by several commands, declared once as ``Annotated`` aliases."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, cast

import typer

from specgen.core.penalties import Penalties
from specgen.errors import UsageError
from specgen.lookahead import LOOKAHEAD_RANGE, Lookahead, parse_lookahead
from specgen.session.prompts import MAX_SEED
from specgen.structured.grammar import LogitBias

MODELS, SAMPLING, OUTPUT, PERFORMANCE = "Models", "Sampling", "Output", "Performance"
WORKERS = "Workers (RPC)"
HELP = {"help_option_names": ["-h", "--help"]}
# llama.cpp rounds a context up to a multiple of 256 tokens; below that it silently uses 256.
MIN_CTX = 256
# -n -1: more than any context holds, so the context or the answer ends first
UNLIMITED_TOKENS = 2**31 - 1


def readable_help_placeholders() -> None:
    """Help shows click's placeholders (TEXT, INTEGER, or an option's own metavar like SPEC)
    rather than Typer's Python types (``<str>``, ``<bool>``, ``<list[str]>``); flags and
    arguments (already named by their metavar) show none."""
    from typer.core import TyperArgument, TyperOption

    names = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "Path": "PATH"}

    def option(self: TyperOption, ctx: typer.Context) -> str | None:
        if self.is_flag or self.count:
            return None
        if self.metavar:
            return self.metavar
        bare = self.bare_type().removeprefix("list[").removesuffix("]")
        return names.get(bare, bare.upper())

    # Typer has no setting for this: its own method is replaced, on purpose, for all commands.
    TyperOption.display_type_rich = option  # type: ignore[method-assign,assignment]
    TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]


def _ctx_size(value: int) -> int:
    if value and value < MIN_CTX:
        raise typer.BadParameter(
            f"{value} is below llama.cpp's smallest context, {MIN_CTX} "
            f"tokens (0: the model's own, up to 4096)"
        )
    return value


def lookahead_of(value: str | None) -> Lookahead | None:
    """A --lookahead value as its parser made it (declared as text: Typer has no Union types)."""
    return cast("Lookahead | None", value)


def _lookahead(text: str) -> Lookahead:
    try:
        return parse_lookahead(text)
    except ValueError as err:
        raise typer.BadParameter(f"{text!r} is not {LOOKAHEAD_RANGE}") from err


PairOpt = Annotated[
    str | None,
    typer.Option(
        "--pair",
        metavar="NAME",
        help="A named draft/target pair from models.toml "
        "(default: the default pair; see `specgen models list`).",
        show_default=False,
        rich_help_panel=MODELS,
    ),
]
TargetOpt = Annotated[
    str | None,
    typer.Option(
        "--target",
        "-m",
        metavar="SPEC",
        help="Target model: a GGUF path, org/repo:file.gguf, "
        "or PAIR:target; with no --pair, your own target (alone, or with --draft).",
        show_default=False,
        rich_help_panel=MODELS,
    ),
]
DraftOpt = Annotated[
    str | None,
    typer.Option(
        "--draft",
        "-md",
        metavar="SPEC",
        help="Draft model: a GGUF path, org/repo:file.gguf, "
        "or PAIR:draft (needs --target or --pair); 'ngram' to draft by prompt lookup with no "
        "draft model; 'mtp' to draft with the target's own MTP head; eagle3:SPEC or "
        "dflash:SPEC for an EAGLE3 or DFlash head (files named so: ./ngram, ./mtp).",
        show_default=False,
        rich_help_panel=MODELS,
    ),
]
# Typer has no Union types: the parser turns the text into a Lookahead (an int, or "auto"),
# which the command reads back with lookahead_of.
LookaheadOpt = Annotated[
    str | None,
    typer.Option(
        "--lookahead",
        "-k",
        parser=_lookahead,
        metavar="K|auto",
        help="Guesses per cycle, K: a number (0: the target alone), or 'auto' to choose K before "
        "each cycle from the acceptance and costs measured so far, turning speculation off when it "
        "cannot pay (default: the pair's own).",
        show_default=False,
        rich_help_panel=MODELS,
    ),
]
NgramOpt = Annotated[
    bool | None,
    typer.Option(
        "--ngram/--no-ngram",
        help="Also draft by prompt lookup beside the draft model (hybrid): "
        "free guesses where the text repeats its input (default: the pair's own setting).",
        show_default=False,
        rich_help_panel=MODELS,
    ),
]
LookupCacheOpt = Annotated[
    str | None,
    typer.Option(
        "--lookup-cache",
        metavar="FILE|off",
        help="Keep prompt lookup's cache of earlier requests (prompts and outputs, for guesses "
        "across requests) in FILE between runs; 'off': no cache (default: in memory for this "
        "process, wherever prompt lookup drafts).",
        show_default=False,
        rich_help_panel=MODELS,
    ),
]


def lookup_cache_of(value: str | None) -> bool | Path:
    """``--lookup-cache``: whether prompt lookup keeps a cache across requests (a bool), or
    the file it is kept in (``Specgen``'s ``lookup_cache``)."""
    if value is None:
        return True
    if value.strip().lower() in ("off", "none", "no"):
        return False
    return Path(value).expanduser()


MtpOpt = Annotated[
    bool | None,
    typer.Option(
        "--mtp/--no-mtp",
        help="Draft with the target's own MTP head (layers in its GGUF; no draft model). By "
        "default a target that has one drafts with it when no draft model is given.",
        show_default=False,
        rich_help_panel=MODELS,
    ),
]
DraftPMinOpt = Annotated[
    float,
    typer.Option(
        "--draft-p-min",
        min=0.0,
        max=0.99,
        help="Stop drafting a cycle when the draft's top "
        "probability falls below this (0: always draft K). Exactness is kept.",
        rich_help_panel=MODELS,
    ),
]
TemperatureOpt = Annotated[
    float,
    typer.Option(
        "--temperature",
        "--temp",
        min=0.0,
        help="Sampling temperature; 0 is greedy.",
        rich_help_panel=SAMPLING,
    ),
]
TopKOpt = Annotated[
    int,
    typer.Option(
        "--top-k", min=0, help="Keep the k most likely tokens (0: off).", rich_help_panel=SAMPLING
    ),
]
TopPOpt = Annotated[
    float,
    typer.Option(
        "--top-p",
        min=0.0,
        max=1.0,
        help="Nucleus: smallest set with this mass (above 0).",
        rich_help_panel=SAMPLING,
    ),
]
MinPOpt = Annotated[
    float,
    typer.Option(
        "--min-p",
        min=0.0,
        max=1.0,
        help="Drop tokens below min-p x the best (below 1).",
        rich_help_panel=SAMPLING,
    ),
]
RepeatPenaltyOpt = Annotated[
    float,
    typer.Option(
        "--repeat-penalty",
        min=0.0,
        help="Penalize tokens of the last --repeat-last-n, as llama.cpp (1: off).",
        rich_help_panel=SAMPLING,
    ),
]
RepeatLastNOpt = Annotated[
    int,
    typer.Option(
        "--repeat-last-n",
        min=-1,
        help="Tokens the penalties count back over (-1: the whole context, 0: off).",
        rich_help_panel=SAMPLING,
    ),
]
PresencePenaltyOpt = Annotated[
    float,
    typer.Option(
        "--presence-penalty",
        min=-2.0,
        max=2.0,
        help="Lower the logit of every token seen there by this (0: off).",
        rich_help_panel=SAMPLING,
    ),
]
FrequencyPenaltyOpt = Annotated[
    float,
    typer.Option(
        "--frequency-penalty",
        min=-2.0,
        max=2.0,
        help="Lower a seen token's logit by this times its count (0: off).",
        rich_help_panel=SAMPLING,
    ),
]
SeedOpt = Annotated[
    int | None,
    typer.Option(
        "--seed",
        "-s",
        min=-1,
        max=MAX_SEED,
        help="Seed: the same sampled text again, at any -k and with any drafter, on this "
        "build and machine (default and -1: none, a random run).",
        show_default=False,
        rich_help_panel=SAMPLING,
    ),
]
MaxTokensOpt = Annotated[
    int,
    typer.Option(
        "--max-tokens",
        "-n",
        min=-1,
        help="Stop after this many new tokens (-1: at the end of the answer or of the context).",
        rich_help_panel=SAMPLING,
    ),
]
ThreadsOpt = Annotated[
    int,
    typer.Option(
        "--threads",
        "-t",
        min=0,
        help="CPU threads for both models (0: the physical cores; run, chat and serve leave "
        "out those other processes keep busy now).",
        rich_help_panel=PERFORMANCE,
    ),
]
CtxOpt = Annotated[
    int,
    typer.Option(
        "--ctx-size",
        "-c",
        min=0,
        callback=_ctx_size,
        help="Context window in tokens, from "
        f"{MIN_CTX} (rounded up to a multiple of {MIN_CTX}; 0: min(4096, trained)).",
        rich_help_panel=PERFORMANCE,
    ),
]


def _parallel(what: str, fewer: str = "") -> typer.models.OptionInfo:
    """``--parallel``: ``what`` (prompts of a batch, a server's requests) decoded side by side,
    by default as many as ``bench --streams`` found best here, else ``session.fit``'s
    ``auto_parallel`` (``fewer``: where fewer are taken)."""
    return typer.Option(
        "--parallel",
        "-np",
        min=1,
        max=64,
        help=f"{what} generating at once (llama.cpp's -np), decoded side by side in one pass "
        "per cycle; each takes a context of --ctx-size tokens (default: what `specgen bench "
        "--streams` found best for these models here, else 4 where their contexts fit in "
        "the memory free (as llama-server's slots), fewer where not; 1 for a hybrid or "
        f"recurrent target, or models on a GPU or workers{fewer}).",
        show_default=False,
        rich_help_panel=PERFORMANCE,
    )


ParallelOpt = Annotated[
    int | None, _parallel("Prompts of a batch", "; a file of fewer prompts, one for each")
]
ServeParallelOpt = Annotated[int | None, _parallel("Requests (the server's slots)")]
GpuLayersOpt = Annotated[
    int,
    typer.Option(
        "--gpu-layers",
        "-ngl",
        help="Layers of each model to offload to the GPU (-1: all; ignored by CPU builds).",
        rich_help_panel=PERFORMANCE,
    ),
]
VerboseOpt = Annotated[
    bool, typer.Option("--verbose", "-v", help="Show llama.cpp's own logs.", rich_help_panel=OUTPUT)
]
RpcOpt = Annotated[
    str | None,
    typer.Option(
        "--rpc",
        metavar="HOST:PORT,...",
        help="Put the target's layers on these `specgen worker`s "
        "(llama.cpp RPC; the draft stays on this machine); 'none': run here even where the pair "
        "names workers (default: the pair's own).",
        show_default=False,
        rich_help_panel=WORKERS,
    ),
]
LocalHeadOpt = Annotated[
    bool,
    typer.Option(
        "--rpc-local-head/--no-rpc-local-head",
        help="With --rpc, keep the target's output layer on "
        "this machine, so each verify sends kilobytes instead of a logit row per token.",
        rich_help_panel=WORKERS,
    ),
]


def read_prompt(argument: str | None, file: Path | None) -> str:
    """The prompt from the argument or a file (``-``: stdin); with no argument and no file,
    piped stdin. stdin is read only then, or when ``-f -`` asks for it beside an argument
    (which it follows on a new line): a command in a ``while read`` loop or after a pipe
    that stays open never waits on stdin it was not given. The one newline a file or
    ``echo`` ends with is dropped."""
    from specgen.session.prompts import combine, read_file, stdin_is_piped, strip_final_newline

    if argument is not None and file is not None and str(file) != "-":
        raise UsageError(
            "give the prompt either as an argument or with --file, not both "
            "(-f - adds stdin after the argument)"
        )
    if file is not None:
        text: str | None = combine(argument, strip_final_newline(read_file(file)))
    elif argument is None and stdin_is_piped():
        text = strip_final_newline(sys.stdin.read())
    else:
        text = argument
    if text is None:
        raise UsageError(
            "no prompt: give one as an argument or with -p, with -f FILE, or on stdin "
            "(e.g. cat prompt.txt | specgen run); `specgen chat` talks"
        )
    if not text.strip():
        raise UsageError("the prompt is empty: give some text to continue")
    return text


def busy_threads_of(value: int) -> int:
    """``-t 0`` (the default) on a machine where other processes keep CPUs busy: the fewer
    threads to load with, said on a terminal (``specgen.host.machine.threads_for_now``); 0
    where ``-t`` was given or nothing is busy (what is remembered stays under ``-t``)."""
    if value:
        return 0
    from specgen.cli.output import out
    from specgen.host.machine import threads_for_now

    threads, why = threads_for_now()
    if why is None:
        return 0
    if out.err.is_terminal:
        out.note(why)
    return threads


def penalties_of(repeat: float, last_n: int, presence: float, frequency: float) -> Penalties | None:
    """The penalty options as one ``Penalties`` (None: they change nothing)."""

    from specgen.core.penalties import penalties_of as active

    try:
        return active(Penalties(repeat, frequency, presence, last_n))
    except ValueError as err:
        raise UsageError(f"--{str(err).replace('_', '-')}") from err


def seed_of(value: int | None) -> int | None:
    """``--seed``: -1 (llama.cpp's spelling of random) is no seed."""
    return None if value is None or value < 0 else value


def max_tokens_of(value: int) -> int:
    """``-n``: -1 (llama.cpp's spelling) runs to the end of the answer or of the context."""
    if value == 0:
        raise UsageError(
            "--max-tokens (-n) 0 generates nothing: give a count of tokens, or -1 for no limit"
        )
    return UNLIMITED_TOKENS if value < 0 else value


def logit_bias_of(given: list[str]) -> LogitBias | None:
    """``--logit-bias ID=BIAS`` options as a LogitBias (None: none given)."""
    if not given:
        return None
    pairs: dict[str, float] = {}
    for item in given:
        token, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            pairs[token.strip()] = float(value)
        except ValueError:
            raise UsageError(f"--logit-bias {item!r}: give ID=BIAS, as 15043=-100") from None
    try:
        return LogitBias.from_mapping(pairs)
    except ValueError as err:
        raise UsageError(f"--{str(err).replace('_', '-')}") from err
