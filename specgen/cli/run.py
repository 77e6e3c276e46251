"""``specgen run``: one prompt streamed to the terminal, or every prompt of a file as JSON lines.

The command parses and checks options, reads the prompt(s), decides and loads the pair once
(``specgen.session.choice``, ``specgen.session.pair``) and hands over to the library
(``specgen.session.generate``, ``specgen.session.batch``); this module only decides what is shown
where: text on stdout, statistics and progress on stderr.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from specgen.cli.batch import finished, open_output, read_batch, run_batch_shown, to_run
from specgen.cli.options import (
    OUTPUT,
    PERFORMANCE,
    SAMPLING,
    CtxOpt,
    DraftOpt,
    DraftPMinOpt,
    FrequencyPenaltyOpt,
    GpuLayersOpt,
    LocalHeadOpt,
    LookaheadOpt,
    LookupCacheOpt,
    MaxTokensOpt,
    MinPOpt,
    MtpOpt,
    NgramOpt,
    PairOpt,
    ParallelOpt,
    PresencePenaltyOpt,
    RepeatLastNOpt,
    RepeatPenaltyOpt,
    RpcOpt,
    SeedOpt,
    TargetOpt,
    TemperatureOpt,
    ThreadsOpt,
    TopKOpt,
    TopPOpt,
    VerboseOpt,
    busy_threads_of,
    logit_bias_of,
    lookahead_of,
    lookup_cache_of,
    max_tokens_of,
    penalties_of,
    read_prompt,
    seed_of,
)
from specgen.cli.output import out
from specgen.core.penalties import DEFAULT_LAST_N, Penalties
from specgen.core.sampling import DEFAULT_SAMPLING
from specgen.engine import DEFAULT_MAX_TOKENS
from specgen.errors import EXIT_INTERRUPTED, Interrupted, UsageError
from specgen.structured import grammar

if TYPE_CHECKING:
    from specgen.api import Settings, Specgen

BATCH = "Batch"


def run(
    prompt: Annotated[
        str | None,
        typer.Argument(
            metavar="PROMPT",
            help="The prompt (escapes like \\n are processed). With none: -p, -f, piped "
            "stdin, or a chat on a terminal.",
            show_default=False,
        ),
    ] = None,
    prompt_option: Annotated[
        str | None,
        typer.Option(
            "--prompt",
            "-p",
            metavar="TEXT",
            help="The prompt, as llama.cpp's -p (the same as the argument).",
            show_default=False,
        ),
    ] = None,
    conversation: Annotated[
        bool,
        typer.Option(
            "--conversation",
            "-cnv",
            help="Chat: a conversation in the terminal (as `specgen chat`; llama.cpp's -cnv).",
        ),
    ] = False,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            "-f",
            metavar="FILE",
            help="Read the prompt from a file ('-': stdin, after the argument if one is "
            "given); a .jsonl file, or --each-line, runs every prompt in it.",
            show_default=False,
        ),
    ] = None,
    pair: PairOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    lookahead: LookaheadOpt = None,
    ngram: NgramOpt = None,
    lookup_cache: LookupCacheOpt = None,
    mtp: MtpOpt = None,
    draft_p_min: DraftPMinOpt = 0.0,
    temperature: TemperatureOpt = DEFAULT_SAMPLING.temperature,
    top_k: TopKOpt = DEFAULT_SAMPLING.top_k,
    top_p: TopPOpt = DEFAULT_SAMPLING.top_p,
    min_p: MinPOpt = DEFAULT_SAMPLING.min_p,
    repeat_penalty: RepeatPenaltyOpt = 1.0,
    repeat_last_n: RepeatLastNOpt = DEFAULT_LAST_N,
    presence_penalty: PresencePenaltyOpt = 0.0,
    frequency_penalty: FrequencyPenaltyOpt = 0.0,
    seed: SeedOpt = None,
    max_tokens: MaxTokensOpt = DEFAULT_MAX_TOKENS,
    stop: Annotated[
        list[str] | None,
        typer.Option(
            "--stop",
            metavar="TEXT",
            help="Stop when this text appears (repeatable; escapes like \\n are processed).",
            show_default=False,
            rich_help_panel=SAMPLING,
        ),
    ] = None,
    json_schema: Annotated[
        str | None,
        typer.Option(
            "--json-schema",
            metavar="FILE|JSON",
            help="The answer is JSON that matches this JSON Schema (a file, or the schema).",
            show_default=False,
            rich_help_panel=OUTPUT,
        ),
    ] = None,
    grammar_text: Annotated[
        str | None,
        typer.Option(
            "--grammar",
            metavar="FILE|GBNF",
            help="The answer matches this grammar (llama.cpp's GBNF, or Lark; a file, or "
            "the grammar).",
            show_default=False,
            rich_help_panel=OUTPUT,
        ),
    ] = None,
    logit_bias: Annotated[
        list[str] | None,
        typer.Option(
            "--logit-bias",
            metavar="ID=BIAS",
            help="Add BIAS (-100 to 100) to token ID's logit, for the target and the draft "
            "alike (repeatable; -100 bans the token).",
            show_default=False,
            rich_help_panel=SAMPLING,
        ),
    ] = None,
    logprobs: Annotated[
        int | None,
        typer.Option(
            "--logprobs",
            metavar="N",
            min=0,
            max=20,
            help="With --json: each token's log-probability under the target, with the N "
            "likeliest tokens there.",
            show_default=False,
            rich_help_panel=OUTPUT,
        ),
    ] = None,
    output_format: Annotated[
        str | None,
        typer.Option(
            "--format",
            metavar="json",
            help="'json': the answer is a JSON object (any).",
            show_default=False,
            rich_help_panel=OUTPUT,
        ),
    ] = None,
    chat: Annotated[
        bool | None,
        typer.Option(
            "--chat/--raw",
            help="Wrap the prompt in the target's chat template, or send it as it "
            "is (default: the pair's setting, else --chat when the target's GGUF has a template).",
            show_default=False,
        ),
    ] = None,
    system: Annotated[
        str | None,
        typer.Option(
            "--system", metavar="TEXT", help="System message (implies --chat).", show_default=False
        ),
    ] = None,
    escapes: Annotated[
        bool,
        typer.Option(
            "--escape/--no-escape",
            help="Process \\n, \\t, \\\\, \\\", \\' and \\xNN in the prompt "
            "argument, --system and --stop, as llama.cpp does.",
        ),
    ] = True,
    each_line: Annotated[
        bool,
        typer.Option(
            "--each-line", help="Batch: every line of --file is a prompt.", rich_help_panel=BATCH
        ),
    ] = False,
    jsonl: Annotated[
        bool,
        typer.Option(
            "--jsonl",
            help="Batch: --file is JSON lines (the default for .jsonl/.ndjson files).",
            rich_help_panel=BATCH,
        ),
    ] = False,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            metavar="FILE",
            help="Batch: append the JSON lines to this file (default: stdout).",
            show_default=False,
            rich_help_panel=BATCH,
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Batch: skip the ids that already have a result in --output.",
            rich_help_panel=BATCH,
        ),
    ] = False,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON object (text and stats) at the end; nothing else on stdout.",
            rich_help_panel=OUTPUT,
        ),
    ] = False,
    no_stats: Annotated[
        bool, typer.Option("--no-stats", help="Print no statistics.", rich_help_panel=OUTPUT)
    ] = False,
    threads: ThreadsOpt = 0,
    target_threads: Annotated[
        int | None,
        typer.Option(
            "--target-threads",
            min=0,
            help="CPU threads for the target (default: --threads).",
            show_default=False,
            rich_help_panel=PERFORMANCE,
        ),
    ] = None,
    draft_threads: Annotated[
        int | None,
        typer.Option(
            "--draft-threads",
            min=0,
            help="CPU threads for the draft (default: --threads).",
            show_default=False,
            rich_help_panel=PERFORMANCE,
        ),
    ] = None,
    gpu_layers: GpuLayersOpt = -1,
    target_gpu_layers: Annotated[
        int | None,
        typer.Option(
            "--target-gpu-layers",
            help="Target layers to offload (default: --gpu-layers).",
            show_default=False,
            rich_help_panel=PERFORMANCE,
        ),
    ] = None,
    draft_gpu_layers: Annotated[
        int | None,
        typer.Option(
            "--draft-gpu-layers",
            "-ngld",
            help="Draft layers to offload (default: --gpu-layers).",
            show_default=False,
            rich_help_panel=PERFORMANCE,
        ),
    ] = None,
    ctx_size: CtxOpt = 0,
    parallel: ParallelOpt = None,
    rpc: RpcOpt = None,
    rpc_local_head: LocalHeadOpt = True,
    verbose: VerboseOpt = False,
) -> None:
    """Generate text from a prompt, with speculative decoding."""
    from specgen.api import Settings, Specgen
    from specgen.core.sampling import SamplingParams
    from specgen.session.prompts import unescape

    esc = unescape if escapes else (lambda text: text)
    if prompt_option is not None:
        if prompt is not None:
            raise UsageError("give the prompt once: as the argument or with -p, not both")
        _not_a_pair(prompt_option)
        prompt = prompt_option
    batch = each_line or jsonl or (file is not None and file.suffix in (".jsonl", ".ndjson"))
    talk = conversation or (
        prompt is None and file is None and not batch and not json_out and sys.stdin.isatty()
    )
    if talk and (batch or file is not None or prompt is not None or json_out):
        raise UsageError(
            "a chat takes its messages from the terminal: drop the prompt, --file and --json "
            "(or drop -cnv to run them)"
        )
    if (output is not None or resume) and not batch:
        raise UsageError(
            "--output and --resume are for batches: add --each-line, or give a .jsonl --file"
        )
    if parallel is not None and parallel > 1 and not batch:
        raise UsageError(
            "--parallel is for batches: give a .jsonl --file, or add --each-line "
            "(one prompt runs as one sequence)"
        )
    if resume and output is None:
        raise UsageError("--resume needs --output FILE (the results to resume from)")
    if batch:
        items = read_batch(prompt, file, each_line, jsonl)
        sink = open_output(output)
        skip = finished(output, resume)
    elif not talk:
        text = read_prompt(None if prompt is None else esc(prompt), file)
    try:
        sampling = SamplingParams(temperature, top_k, top_p, min_p)
    except ValueError as err:  # the open ends of the ranges the options already check
        raise UsageError(str(err).replace("top_p", "--top-p").replace("min_p", "--min-p")) from err
    settings = Settings(
        sampling=sampling,
        max_tokens=max_tokens_of(max_tokens),
        stop=tuple(esc(s) for s in stop or ()),
        seed=seed_of(seed),
        grammar=grammar.from_options(json_schema, grammar_text, output_format),
        logit_bias=logit_bias_of(logit_bias or []),
        logprobs=logprobs,
        penalties=penalties_of(repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty),
    )
    system_text = None if system is None else esc(system)
    sg = Specgen(
        pair,
        target,
        draft,
        lookahead=lookahead_of(lookahead),
        ngram=ngram,
        mtp=mtp,
        n_ctx=ctx_size,
        threads=target_threads or threads,
        gpu_layers=gpu_layers if target_gpu_layers is None else target_gpu_layers,
        draft_threads=draft_threads or threads,
        busy_threads=busy_threads_of(threads),
        draft_gpu_layers=gpu_layers if draft_gpu_layers is None else draft_gpu_layers,
        draft_p_min=draft_p_min,
        chat=chat,
        verbose=verbose,
        progress=True,
        from_bench=sampling.temperature,
        explain_alone=True,
        rpc=rpc,
        rpc_local_head=rpc_local_head,
        lookup_cache=lookup_cache_of(lookup_cache),
        parallel=("auto" if parallel is None else parallel) if batch else 1,
        prompts=to_run(items, skip) if batch else None,
    )
    for note in sg.pair.notes:
        out.warning(note)
    if talk:
        from specgen.cli.chat import converse

        converse(sg, settings, system_text, show_stats=not no_stats)
        return
    use_chat = sg.wants_chat("", system_text)
    if batch:
        if sg.note and not no_stats:
            out.note(sg.note)
        code = run_batch_shown(
            sg, settings, items, sink, output, skip, use_chat, system_text, no_stats
        )
        if code == EXIT_INTERRUPTED:
            raise Interrupted()
        raise typer.Exit(code)
    _single(sg, settings, text, use_chat, system_text, json_out, no_stats)


def _not_a_pair(prompt: str) -> None:
    """``-p`` was the pair before it was the prompt: a prompt that is a pair's name is that."""
    from specgen.errors import UserError
    from specgen.models.registry import Registry

    try:
        names = Registry.load().pairs
    except UserError:  # a broken models.toml is said where a pair is looked up
        return
    if prompt in names:
        raise UsageError(
            f"-p is the prompt now, as in llama.cpp: name the pair with --pair {prompt}"
        )


def _single(
    sg: Specgen,
    settings: Settings,
    text: str,
    chat: bool,
    system: str | None,
    json_out: bool,
    no_stats: bool,
) -> None:
    from specgen.cli.live import StreamView

    if sg.note and not (no_stats or json_out):
        out.note(sg.note)
    stats = sg.new_stats(settings)
    with StreamView(stats, show_stats=not no_stats and not json_out) as view:
        result = sg.run(
            text,
            settings,
            chat=chat,
            system=system,
            stats=stats,
            on_text=None if json_out else view.write,
        )
    if stats.stop_reason == "context_full":
        out.warning(
            f"stopped: the context window ({sg.pair.target.n_ctx} tokens) is full; "
            f"raise --ctx-size for longer generations"
        )
    elif not result.text and not result.interrupted:
        hint = (
            "the prompt may need the target's chat template (--chat)"
            if not chat
            else "try another prompt or a higher --temperature"
        )
        out.warning(
            f"the model ended its answer before any text (stop: {stats.stop_reason}); {hint}"
        )
    if json_out:
        out.json({**result.as_dict(), **_run_facts(sg, settings, chat)})
    if result.interrupted:
        raise Interrupted()


def _run_facts(sg: Specgen, settings: Settings, chat: bool) -> dict[str, object]:
    """What ran, for ``--json``: the models, the settings and the context."""
    loaded, sampling = sg.pair, settings.sampling
    penalties = settings.penalties or Penalties()
    return {
        "pair": sg.decision.name,
        "target": str(loaded.target.path),
        "draft": str(loaded.draft.path) if loaded.draft else None,
        "ngram": loaded.ngram,
        "mtp": loaded.mtp,
        "head": loaded.head_kind if loaded.head is not None and not loaded.mtp else None,
        "rollback": loaded.rollback_facts(),
        "params": {
            "lookahead": loaded.lookahead,
            "draft_p_min": loaded.draft_p_min,
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "min_p": sampling.min_p,
            "repeat_penalty": penalties.repeat,
            "frequency_penalty": penalties.frequency,
            "presence_penalty": penalties.presence,
            "repeat_last_n": penalties.last_n,
            "max_tokens": settings.max_tokens,
            "stop": list(settings.stop),
            "chat": chat,
            "n_ctx": loaded.target.n_ctx,
            "threads": loaded.target.n_threads,
        },
    }


# What a chat has no use for: its messages come from the terminal, its answers go there.
_NOT_IN_CHAT = (
    "prompt",
    "prompt_option",
    "conversation",
    "chat",
    "file",
    "each_line",
    "jsonl",
    "output",
    "resume",
    "json_out",
    "logprobs",
    "parallel",
)


def chat(**options: Any) -> None:
    """Chat with the pair in the terminal: the conversation's prefix reused each turn."""
    run(**{**_CHAT_DEFAULTS, **options, "conversation": True})


_RUN = inspect.signature(run, eval_str=True)
_CHAT_DEFAULTS = {name: _RUN.parameters[name].default for name in _NOT_IN_CHAT}
chat.__signature__ = _RUN.replace(  # type: ignore[attr-defined]
    parameters=[p for name, p in _RUN.parameters.items() if name not in _NOT_IN_CHAT]
)
