"""``specgen run``: one prompt streamed to the terminal, or every prompt of a file as JSON lines.

The command parses and checks options, reads the prompt(s), loads the pair once and hands over
to the library (``specgen.session``, ``specgen.batch``); this module only decides what is shown
where: text on stdout, statistics and progress on stderr.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from specgen.engine import DEFAULT_MAX_TOKENS
from specgen.errors import EXIT_FAILED, EXIT_INTERRUPTED, Interrupted, UsageError
from specgen.lookahead import Lookahead
from specgen.options import (
    OUTPUT,
    PERFORMANCE,
    RUN_SAMPLING,
    SAMPLING,
    CtxOpt,
    DraftOpt,
    DraftPMinOpt,
    GpuLayersOpt,
    LocalHeadOpt,
    LookaheadOpt,
    MaxTokensOpt,
    MinPOpt,
    NgramOpt,
    PairOpt,
    RpcOpt,
    SeedOpt,
    TargetOpt,
    TemperatureOpt,
    ThreadsOpt,
    TopKOpt,
    TopPOpt,
    VerboseOpt,
)

if TYPE_CHECKING:
    from specgen.engine import GenerationConfig
    from specgen.prompts import BatchItem
    from specgen.session import Choice, Pair, PairOptions

err_console = Console(stderr=True)
BATCH = "Batch"


def run(
    prompt: Annotated[str | None, typer.Argument(
        metavar="PROMPT", help="The prompt (escapes like \\n are processed). Piped text is "
        "added after it on a new line.", show_default=False)] = None,
    file: Annotated[Path | None, typer.Option(
        "--file", "-f", metavar="FILE", help="Read the prompt from a file ('-': stdin); a "
        ".jsonl file, or --each-line, runs every prompt in it.", show_default=False)] = None,
    pair: PairOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    lookahead: LookaheadOpt = None,
    ngram: NgramOpt = None,
    draft_p_min: DraftPMinOpt = 0.0,
    temperature: TemperatureOpt = RUN_SAMPLING.temperature,
    top_k: TopKOpt = RUN_SAMPLING.top_k,
    top_p: TopPOpt = RUN_SAMPLING.top_p,
    min_p: MinPOpt = RUN_SAMPLING.min_p,
    seed: SeedOpt = None,
    max_tokens: MaxTokensOpt = DEFAULT_MAX_TOKENS,
    stop: Annotated[list[str] | None, typer.Option(
        "--stop", metavar="TEXT", help="Stop when this text appears (repeatable; escapes like "
        "\\n are processed).", show_default=False, rich_help_panel=SAMPLING)] = None,
    chat: Annotated[bool | None, typer.Option(
        "--chat/--raw", help="Wrap the prompt in the target's chat template, or send it as it "
        "is (default: the pair's setting, else --chat when the target's GGUF has a template).",
        show_default=False)] = None,
    system: Annotated[str | None, typer.Option(
        "--system", metavar="TEXT", help="System message (implies --chat).",
        show_default=False)] = None,
    escapes: Annotated[bool, typer.Option(
        "--escape/--no-escape", help="Process \\n, \\t, \\\\, \\\", \\' and \\xNN in the prompt "
        "argument, --system and --stop, as llama.cpp does.")] = True,
    each_line: Annotated[bool, typer.Option(
        "--each-line", help="Batch: every line of --file is a prompt.",
        rich_help_panel=BATCH)] = False,
    jsonl: Annotated[bool, typer.Option(
        "--jsonl", help="Batch: --file is JSON lines (the default for .jsonl/.ndjson files).",
        rich_help_panel=BATCH)] = False,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", metavar="FILE", help="Batch: append the JSON lines to this file "
        "(default: stdout).", show_default=False, rich_help_panel=BATCH)] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Batch: skip the ids that already have a result in --output.",
        rich_help_panel=BATCH)] = False,
    json_out: Annotated[bool, typer.Option(
        "--json", help="Print one JSON object (text and stats) at the end; nothing else on "
        "stdout.", rich_help_panel=OUTPUT)] = False,
    no_stats: Annotated[bool, typer.Option(
        "--no-stats", help="Print no statistics.", rich_help_panel=OUTPUT)] = False,
    threads: ThreadsOpt = 0,
    target_threads: Annotated[int | None, typer.Option(
        "--target-threads", min=0, help="CPU threads for the target (default: --threads).",
        show_default=False, rich_help_panel=PERFORMANCE)] = None,
    draft_threads: Annotated[int | None, typer.Option(
        "--draft-threads", min=0, help="CPU threads for the draft (default: --threads).",
        show_default=False, rich_help_panel=PERFORMANCE)] = None,
    gpu_layers: GpuLayersOpt = -1,
    target_gpu_layers: Annotated[int | None, typer.Option(
        "--target-gpu-layers", help="Target layers to offload (default: --gpu-layers).",
        show_default=False, rich_help_panel=PERFORMANCE)] = None,
    draft_gpu_layers: Annotated[int | None, typer.Option(
        "--draft-gpu-layers", "-ngld", help="Draft layers to offload (default: --gpu-layers).",
        show_default=False, rich_help_panel=PERFORMANCE)] = None,
    ctx_size: CtxOpt = 0,
    rpc: RpcOpt = None,
    rpc_local_head: LocalHeadOpt = True,
    verbose: VerboseOpt = False,
) -> None:
    """Generate text from a prompt, with speculative decoding."""
    from specgen.core.sampling import SamplingParams
    from specgen.engine import GenerationConfig
    from specgen.prompts import unescape
    from specgen.session import PairOptions, wants_chat

    esc = unescape if escapes else (lambda text: text)
    batch = each_line or jsonl or (file is not None and file.suffix in (".jsonl", ".ndjson"))
    if (output is not None or resume) and not batch:
        raise UsageError("--output and --resume are for batches: add --each-line, or give a "
                         ".jsonl --file")
    if resume and output is None:
        raise UsageError("--resume needs --output FILE (the results to resume from)")
    if batch:
        items = _read_batch(prompt, file, each_line, jsonl)
        sink = _open_output(output)
    else:
        text = _read_prompt(None if prompt is None else esc(prompt), file)
    try:
        sampling = SamplingParams(temperature, top_k, top_p, min_p)
    except ValueError as err:  # the open ends of the ranges the options already check
        raise UsageError(str(err).replace("top_p", "--top-p").replace("min_p", "--min-p"))\
            from err
    config = GenerationConfig(lookahead=0, sampling=sampling, max_tokens=max_tokens,
                              stop=tuple(esc(s) for s in stop or ()), seed=seed)
    options = PairOptions(
        n_ctx=ctx_size,
        target_threads=target_threads or threads,
        draft_threads=draft_threads or threads,
        target_gpu_layers=gpu_layers if target_gpu_layers is None else target_gpu_layers,
        draft_gpu_layers=gpu_layers if draft_gpu_layers is None else draft_gpu_layers,
        verbose=verbose,
        local_head=rpc_local_head,
    )
    setup = _setup(pair, target, draft, ngram, lookahead, rpc, options, config,
                   quiet=no_stats or json_out)
    system_text = None if system is None else esc(system)
    use_chat = wants_chat(setup.loaded, setup.chat, chat, system_text)
    if batch:
        code = _batch(setup, items, sink, output, resume, use_chat, system_text, draft_p_min,
                      no_stats)
        if code == EXIT_INTERRUPTED:
            raise Interrupted()
        raise typer.Exit(code)
    _single(setup, text, use_chat, system_text, draft_p_min, json_out, no_stats)


def _read_prompt(argument: str | None, file: Path | None) -> str:
    """The prompt from the argument, a file (``-``: stdin), or both the argument and piped
    stdin; the one newline a file or ``echo`` ends with is dropped."""
    from specgen.prompts import combine, strip_final_newline

    if argument is not None and file is not None:
        raise UsageError("give the prompt either as an argument or with --file, not both")
    if file is not None:
        text: str | None = strip_final_newline(_read_file(file))
    else:
        piped = sys.stdin.read() if _stdin_is_piped() else None
        text = combine(argument, None if piped is None else strip_final_newline(piped))
    if text is None:
        raise UsageError("no prompt: give one as an argument, with -f FILE, or on stdin "
                         "(e.g. cat prompt.txt | specgen run ...)")
    if not text.strip():
        raise UsageError("the prompt is empty: give some text to continue")
    return text


def _stdin_is_piped() -> bool:
    """Whether stdin is a pipe or a file (never a terminal, /dev/null or a closed stream)."""
    try:
        mode = stat.S_IFMT(os.fstat(sys.stdin.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):
        return False
    return mode in (stat.S_IFIFO, stat.S_IFREG, stat.S_IFSOCK)


def _read_file(file: Path) -> str:
    if str(file) == "-":
        return sys.stdin.read()
    if file.is_dir():
        raise UsageError(f"{file} is a folder: give a text file to --file")
    return file.read_text(encoding="utf-8")


def _read_batch(argument: str | None, file: Path | None, each_line: bool, jsonl: bool
                ) -> list[BatchItem]:
    from specgen.prompts import parse_jsonl, parse_lines

    if file is None:
        raise UsageError("a batch reads its prompts from --file FILE ('-': stdin)")
    if argument is not None:
        raise UsageError("a batch takes its prompts from --file, not from an argument")
    if each_line and jsonl:
        raise UsageError("--each-line and --jsonl are two formats: pick one")
    text = _read_file(file)
    return parse_lines(text) if each_line else parse_jsonl(text)


def _open_output(output: Path | None) -> IO[str]:
    """The batch's sink, opened before the models load so a bad -o fails at once."""
    if output is None:
        return sys.stdout
    if output.is_dir():
        raise UsageError(f"--output {output} is a folder: give a file")
    output.parent.mkdir(parents=True, exist_ok=True)
    sink = output.open("a", encoding="utf-8")
    if sink.tell() > 0:
        with output.open("rb") as existing:
            existing.seek(-1, os.SEEK_END)
            if existing.read(1) != b"\n":  # a line a crash cut short: keep it on its own
                sink.write("\n")
    return sink


@dataclass
class _Setup:
    """The loaded pair and what was chosen for it, shared by a single run and a batch."""

    choice: Choice
    loaded: Pair
    target_path: Path
    draft_path: Path | None
    config: GenerationConfig
    k_note: str

    @property
    def chat(self) -> bool | None:
        return self.choice.chat


def _setup(pair: str | None, target: str | None, draft: str | None, ngram: bool | None,
           lookahead: Lookahead | None, rpc: str | None, options: PairOptions,
           config: GenerationConfig, quiet: bool) -> _Setup:
    """Choose the models and K, fetch and self-test them, load them once."""
    from dataclasses import replace

    from specgen.registry import NGRAM, Registry, resolve
    from specgen.selftest import ensure_cpu_works
    from specgen.session import choose, from_bench, load_pair

    choice = choose(Registry.load(), pair, target, draft, ngram, rpc)
    options = replace(options, workers=choice.workers)
    note = ""
    if lookahead is None and ngram is None and draft != NGRAM:
        choice, lookahead, note = from_bench(choice, options.target_threads,
                                             options.target_gpu_layers,
                                             config.sampling.temperature)
    k = choice.lookahead if lookahead is None else lookahead
    if not choice.drafts:
        if k != 0 and not note:
            note = ("no draft model: running the target alone (-k 0; --draft ngram drafts "
                    "without one)")
        k = 0
    target_path = resolve(choice.target)
    draft_path = resolve(choice.draft) if choice.draft is not None and k != 0 else None
    ensure_cpu_works([p for p in (target_path, draft_path) if p is not None])
    loaded = load_pair(target_path, draft_path, options, ngram=choice.ngram and k != 0)
    return _Setup(choice, loaded, target_path, draft_path, replace(config, lookahead=k),
                  "" if quiet else note)


def _single(setup: _Setup, text: str, chat: bool, system: str | None, draft_p_min: float,
            json_out: bool, no_stats: bool) -> None:
    from specgen.session import generate, new_stats
    from specgen.view import StreamView

    if setup.k_note:
        err_console.print(setup.k_note, style="dim", highlight=False, soft_wrap=True)
    stats = new_stats(setup.loaded, setup.config, draft_p_min)
    with StreamView(stats, show_stats=not no_stats and not json_out) as view:
        result = generate(setup.loaded, text, setup.config, chat=chat, system=system,
                          draft_p_min=draft_p_min, stats=stats,
                          on_text=None if json_out else view.write)
    if stats.stop_reason == "context_full":
        err_console.print(f"stopped: the context window ({setup.loaded.target.n_ctx} tokens) is "
                          f"full; raise --ctx-size for longer generations", style="yellow",
                          highlight=False, soft_wrap=True)
    elif not result.text and not result.interrupted:
        hint = ("the prompt may need the target's chat template (--chat)" if not chat else
                "try another prompt or a higher --temperature")
        err_console.print(f"the model ended its answer before any text (stop: "
                          f"{stats.stop_reason}); {hint}", style="yellow", highlight=False,
                          soft_wrap=True)
    if json_out:
        sys.stdout.write(json.dumps({**result.as_dict(), **_run_facts(setup, draft_p_min,
                                                                       chat)}) + "\n")
    if result.interrupted:
        raise Interrupted()


def _run_facts(setup: _Setup, draft_p_min: float, chat: bool) -> dict[str, object]:
    config = setup.config
    sampling = config.sampling
    return {
        "pair": setup.choice.pair.name if setup.choice.pair else None,
        "target": str(setup.target_path),
        "draft": str(setup.draft_path) if setup.draft_path else None,
        "ngram": setup.loaded.ngram,
        "params": {"lookahead": config.lookahead, "draft_p_min": draft_p_min,
                   "temperature": sampling.temperature, "top_k": sampling.top_k,
                   "top_p": sampling.top_p, "min_p": sampling.min_p,
                   "max_tokens": config.max_tokens, "stop": list(config.stop), "chat": chat,
                   "n_ctx": setup.loaded.target.n_ctx},
    }


def _batch(setup: _Setup, items: list[BatchItem], sink: IO[str], output: Path | None, resume: bool,
           chat: bool, system: str | None, draft_p_min: float, no_stats: bool) -> int:
    """Run every prompt; the exit code says whether all went well (1: some failed)."""
    from specgen.batch import finished_ids, run_batch

    skip = finished_ids(output) if resume and output is not None else set()

    def write(record: dict[str, object]) -> None:
        sink.write(json.dumps(record, ensure_ascii=False) + "\n")
        sink.flush()

    bar = Progress(TextColumn("[bold]batch"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[rates]}"), TimeRemainingColumn(),
                   console=err_console, transient=True,
                   disable=no_stats or not err_console.is_terminal)
    with bar:
        task = bar.add_task("batch", total=len(items), rates="")

        def on_progress(p) -> None:
            rate = "-" if p.accept_rate is None else f"{p.accept_rate:.0%}"
            speed = "-" if p.tokens_per_second is None else f"{p.tokens_per_second:.1f}"
            bar.update(task, completed=p.done + p.failed + p.skipped,
                       rates=f"accept {rate}  {speed} tok/s")

        progress = run_batch(setup.loaded, items, setup.config, chat=chat, system=system,
                             draft_p_min=draft_p_min, write=write, skip=skip,
                             on_progress=on_progress, total=len(items))
    if sink is not sys.stdout:
        sink.close()
    if not no_stats:
        _batch_summary(progress, output)
    if progress.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if progress.failed else 0


def _batch_summary(p, output: Path | None) -> None:
    parts = [f"batch: {p.done} of {p.total} prompts done"]
    if p.failed:
        parts.append(f"{p.failed} failed (error lines in {output or 'the output'})")
    if p.skipped:
        parts.append(f"{p.skipped} skipped (already in {output})")
    if p.interrupted:
        parts.append("interrupted (run again with --resume to finish)")
    if p.accept_rate is not None:
        parts.append(f"accept {p.accept_rate:.0%}")
    if p.tokens_per_second is not None:
        parts.append(f"{p.tokens_per_second:.1f} tok/s")
    err_console.print(", ".join(parts), highlight=False, soft_wrap=True,
                      style="yellow" if p.failed or p.interrupted else None)
