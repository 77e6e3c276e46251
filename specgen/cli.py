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
from specgen.cli_bench import bench
from specgen.cli_models import app as models_app
from specgen.errors import UserError, describe
from specgen.options import (
    OUTPUT,
    PERFORMANCE,
    SAMPLING,
    CtxOpt,
    DraftOpt,
    DraftPMinOpt,
    GpuLayersOpt,
    LookaheadOpt,
    MaxTokensOpt,
    MinPOpt,
    NgramOpt,
    PairOpt,
    SeedOpt,
    TargetOpt,
    TemperatureOpt,
    ThreadsOpt,
    TopKOpt,
    TopPOpt,
    VerboseOpt,
)

app = typer.Typer(
    name="specgen",
    help="Fast local text generation with speculative decoding on llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err_console = Console(stderr=True)

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
    file: Annotated[Path | None, typer.Option(
        "--file", "-f", help="Read the prompt from a file ('-' for stdin).",
        show_default=False)] = None,
    pair: PairOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    lookahead: LookaheadOpt = None,
    ngram: NgramOpt = None,
    draft_p_min: DraftPMinOpt = 0.0,
    temperature: TemperatureOpt = 0.8,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05,
    seed: SeedOpt = None,
    max_tokens: MaxTokensOpt = 256,
    stop: Annotated[list[str] | None, typer.Option(
        "--stop", help="Stop when this text appears (repeatable).", show_default=False,
        rich_help_panel=SAMPLING)] = None,
    chat: Annotated[bool | None, typer.Option(
        "--chat/--raw", help="Wrap the prompt in the target's chat template, or send it as it is "
        "(default: --chat for chat pairs).", show_default=False)] = None,
    system: Annotated[str | None, typer.Option(
        "--system", help="System message (with --chat).", show_default=False)] = None,
    json_out: Annotated[bool, typer.Option(
        "--json", help="Print one JSON object (text and stats) at the end; nothing else on "
        "stdout.", rich_help_panel=OUTPUT)] = False,
    no_stats: Annotated[bool, typer.Option(
        "--no-stats", help="Print no statistics.", rich_help_panel=OUTPUT)] = False,
    threads: ThreadsOpt = 0,
    target_threads: Annotated[int | None, typer.Option(
        "--target-threads", help="CPU threads for the target (default: --threads).",
        show_default=False, rich_help_panel=PERFORMANCE)] = None,
    draft_threads: Annotated[int | None, typer.Option(
        "--draft-threads", help="CPU threads for the draft (default: --threads).",
        show_default=False, rich_help_panel=PERFORMANCE)] = None,
    gpu_layers: GpuLayersOpt = -1,
    target_gpu_layers: Annotated[int | None, typer.Option(
        "--target-gpu-layers", help="Target layers to offload (default: --gpu-layers).",
        show_default=False, rich_help_panel=PERFORMANCE)] = None,
    draft_gpu_layers: Annotated[int | None, typer.Option(
        "--draft-gpu-layers", "-ngld", help="Draft layers to offload (default: --gpu-layers).",
        show_default=False, rich_help_panel=PERFORMANCE)] = None,
    ctx_size: CtxOpt = 0,
    verbose: VerboseOpt = False,
) -> None:
    """Generate text from a prompt, with speculative decoding."""
    from specgen.core.sampling import SamplingParams
    from specgen.engine import GenerationConfig
    from specgen.registry import Registry, resolve
    from specgen.session import PairOptions, choose, generate_text, load_pair

    text = _read_prompt(prompt, file)
    try:
        sampling = SamplingParams(temperature, top_k, top_p, min_p)
    except ValueError as err:
        raise UserError(f"{err}; see specgen run --help") from err
    choice = choose(Registry.load(), pair, target, draft, ngram)
    k = choice.lookahead if lookahead is None else lookahead
    use_chat = choice.chat if chat is None else chat
    alone_note = not choice.drafts and k != 0 and not (no_stats or json_out)
    if not choice.drafts:
        k = 0
    config = GenerationConfig(lookahead=k, sampling=sampling, max_tokens=max_tokens,
                              stop=tuple(stop or ()), seed=seed)
    target_path = resolve(choice.target)
    draft_path = resolve(choice.draft) if choice.draft is not None and k != 0 else None
    options = PairOptions(
        n_ctx=ctx_size,
        target_threads=target_threads or threads,
        draft_threads=draft_threads or threads,
        target_gpu_layers=gpu_layers if target_gpu_layers is None else target_gpu_layers,
        draft_gpu_layers=gpu_layers if draft_gpu_layers is None else draft_gpu_layers,
        verbose=verbose,
    )
    loaded = load_pair(target_path, draft_path, options, ngram=choice.ngram and k != 0)
    if alone_note:
        err_console.print("no draft model: running the target alone (-k 0; --draft ngram "
                          "drafts without one)", style="yellow")
    result = generate_text(loaded, text, config, chat=use_chat, system=system,
                           show_stats=not no_stats and not json_out, stream=not json_out,
                           draft_p_min=draft_p_min)
    if json_out:
        sys.stdout.write(json.dumps({
            "text": result.text,
            "pair": choice.pair.name if choice.pair else None,
            "target": str(target_path),
            "draft": str(draft_path) if draft_path else None,
            "ngram": loaded.ngram,
            "params": {"lookahead": result.stats.lookahead, "draft_p_min": draft_p_min,
                       "temperature": temperature,
                       "top_k": top_k, "top_p": top_p, "min_p": min_p,
                       "max_tokens": max_tokens, "stop": list(stop or ()), "chat": use_chat},
            "stats": result.stats.as_dict(),
        }) + "\n")
    if result.interrupted:
        raise typer.Exit(130)


app.add_typer(models_app, name="models")
app.command("bench")(bench)


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
        err_console.print("interrupted", style="yellow")
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
