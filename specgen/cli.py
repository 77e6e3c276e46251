"""The ``specgen`` command line: thin Typer commands over the engine, the registry and the bench.

Each command parses options, builds plain objects and hands them on; ``main`` owns the error
table (``specgen.errors``): a user's mistake ends as one line on stderr, never a traceback.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from specgen import __version__
from specgen.errors import UserError, describe

app = typer.Typer(
    name="specgen",
    help="Fast local text generation with speculative decoding on llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err_console = Console(stderr=True)

# -- options shared by several commands -------------------------------------------------------
TargetOpt = Annotated[str | None, typer.Option("--target", "-m", help="Target model: a GGUF path.",
                                               show_default=False)]
DraftOpt = Annotated[str | None, typer.Option("--draft", "-md",
                                              help="Draft model: a GGUF path.", show_default=False)]
TemperatureOpt = Annotated[float, typer.Option("--temperature", "--temp",
                                               help="Sampling temperature; 0 is greedy.")]
TopKOpt = Annotated[int, typer.Option("--top-k", help="Keep the k most likely tokens (0: off).")]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Nucleus: smallest set with this mass.")]
MinPOpt = Annotated[float, typer.Option("--min-p", help="Drop tokens below min-p x the best.")]
SeedOpt = Annotated[int | None, typer.Option("--seed", "-s", help="Random seed (default: random; "
                                             "printed with the stats).", show_default=False)]
MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", "-n", min=1,
                                           help="Stop after this many new tokens.")]
ThreadsOpt = Annotated[int, typer.Option("--threads", help="CPU threads for both models "
                                         "(0: physical cores).")]
CtxOpt = Annotated[int, typer.Option("--ctx-size", "-c", min=0,
                                     help="Context window in tokens (0: min(4096, trained)).")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show llama.cpp's own logs.")]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"specgen {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Fast local text generation with speculative decoding on llama.cpp."""


def _read_prompt(prompt: str | None, file: Path | None) -> str:
    """The prompt from the argument, a file (``-`` is stdin), or piped stdin."""
    if prompt is not None and file is not None:
        raise UserError("give the prompt either as an argument or with --file, not both")
    if file is not None:
        text = sys.stdin.read() if str(file) == "-" else file.read_text(encoding="utf-8")
    elif prompt is not None:
        text = prompt
    elif not sys.stdin.isatty():
        text = sys.stdin.read()
    else:
        raise UserError("no prompt: give one as an argument, with -f FILE, or on stdin "
                        "(e.g. cat prompt.txt | specgen run ...)")
    if not text.strip():
        raise UserError("the prompt is empty: give some text to continue")
    return text


@app.command()
def run(
    prompt: Annotated[str | None, typer.Argument(help="The prompt (or use --file, or pipe it).",
                                                 show_default=False)] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="Read the prompt from a file "
                                              "('-' for stdin).", show_default=False)] = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    lookahead: Annotated[int, typer.Option("--lookahead", "-k", min=0, max=64,
                                           help="Draft tokens per cycle, K (0: target alone).")
                         ] = 4,
    temperature: TemperatureOpt = 0.8,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05,
    seed: SeedOpt = None,
    max_tokens: MaxTokensOpt = 256,
    stop: Annotated[list[str] | None, typer.Option("--stop", help="Stop when this text appears "
                                                   "(repeatable).", show_default=False)] = None,
    chat: Annotated[bool, typer.Option("--chat/--raw", help="Wrap the prompt in the target's "
                                       "chat template, or send it as it is.")] = False,
    system: Annotated[str | None, typer.Option("--system", help="System message (with --chat).",
                                               show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object (text and "
                                           "stats) at the end; nothing else on stdout.")] = False,
    no_stats: Annotated[bool, typer.Option("--no-stats", help="Print no statistics.")] = False,
    threads: ThreadsOpt = 0,
    target_threads: Annotated[int | None, typer.Option("--target-threads", help="CPU threads "
                              "for the target (default: --threads).", show_default=False)] = None,
    draft_threads: Annotated[int | None, typer.Option("--draft-threads", help="CPU threads for "
                             "the draft (default: --threads).", show_default=False)] = None,
    target_gpu_layers: Annotated[int, typer.Option("--target-gpu-layers", "-ngl",
                                 help="Target layers to offload to the GPU (-1: all).")] = -1,
    draft_gpu_layers: Annotated[int, typer.Option("--draft-gpu-layers", "-ngld",
                                help="Draft layers to offload to the GPU (-1: all).")] = -1,
    ctx_size: CtxOpt = 0,
    verbose: VerboseOpt = False,
) -> None:
    """Generate text from a prompt, with speculative decoding."""
    from specgen.core.sampling import SamplingParams
    from specgen.engine import GenerationConfig
    from specgen.session import PairOptions, generate_text, load_pair

    text = _read_prompt(prompt, file)
    try:
        sampling = SamplingParams(temperature, top_k, top_p, min_p)
    except ValueError as err:
        raise UserError(f"{err}; see specgen run --help") from err
    config = GenerationConfig(lookahead=lookahead, sampling=sampling, max_tokens=max_tokens,
                              stop=tuple(stop or ()), seed=seed)
    if target is None:
        raise UserError("no target model: pass --target PATH.gguf (and --draft PATH.gguf)")
    options = PairOptions(
        n_ctx=ctx_size,
        target_threads=target_threads or threads,
        draft_threads=draft_threads or threads,
        target_gpu_layers=target_gpu_layers,
        draft_gpu_layers=draft_gpu_layers,
        verbose=verbose,
    )
    pair = load_pair(target, draft if lookahead > 0 else None, options)
    result = generate_text(pair, text, config, chat=chat, system=system,
                           show_stats=not no_stats and not json_out, stream=not json_out)
    if json_out:
        sys.stdout.write(json.dumps({
            "text": result.text,
            "target": str(pair.target.path),
            "draft": str(pair.draft.path) if pair.draft else None,
            "params": {"lookahead": result.stats.lookahead, "temperature": temperature,
                       "top_k": top_k, "top_p": top_p, "min_p": min_p,
                       "max_tokens": max_tokens, "stop": list(stop or ()), "chat": chat},
            "stats": result.stats.as_dict(),
        }) + "\n")
    if result.interrupted:
        raise typer.Exit(130)


def main() -> None:
    """Entry point: run the app, turning a user's mistakes into one line each."""
    try:
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except typer.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as err:  # the error table decides what a user sees
        if os.environ.get("SPECGEN_DEBUG"):
            raise
        message = describe(err)
        if message is None:
            click_like = getattr(err, "show", None)
            if callable(click_like):  # Typer's usage errors: print them as Typer would
                click_like()
                sys.exit(getattr(err, "exit_code", 2))
            err_console.print(f"[bold red]error:[/] internal error: {type(err).__name__}: {err} "
                              f"(rerun with SPECGEN_DEBUG=1 for the traceback, and report it)",
                              highlight=False, soft_wrap=True)
            sys.exit(1)
        err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False,
                          soft_wrap=True)
        sys.exit(1)
