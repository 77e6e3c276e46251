"""``specgen run``: one prompt streamed to the terminal, or every prompt of a file as JSON lines.

The command parses and checks options, reads the prompt(s), decides and loads the pair once
(``specgen.session.choice``, ``specgen.session.pair``) and hands over to the library
(``specgen.session.generate``, ``specgen.session.batch``); this module only decides what is shown
where: text on stdout, statistics and progress on stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from specgen.cli.batch import open_output, read_batch, run_batch_shown
from specgen.cli.options import (
    OUTPUT,
    PERFORMANCE,
    SAMPLING,
    CtxOpt,
    DraftOpt,
    DraftPMinOpt,
    GpuLayersOpt,
    LocalHeadOpt,
    LookaheadOpt,
    LookupCacheOpt,
    MaxTokensOpt,
    MinPOpt,
    MtpOpt,
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
    lookahead_of,
    lookup_cache_of,
)
from specgen.cli.output import out
from specgen.core.sampling import DEFAULT_SAMPLING
from specgen.engine import DEFAULT_MAX_TOKENS
from specgen.errors import EXIT_INTERRUPTED, Interrupted, UsageError
from specgen.structured import grammar
from specgen.structured.grammar import LogitBias

if TYPE_CHECKING:
    from specgen.engine import GenerationConfig
    from specgen.session.decide import Decision
    from specgen.session.pair import Pair

BATCH = "Batch"


def run(
    prompt: Annotated[
        str | None,
        typer.Argument(
            metavar="PROMPT",
            help="The prompt (escapes like \\n are processed). Piped text is "
            "added after it on a new line.",
            show_default=False,
        ),
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            "-f",
            metavar="FILE",
            help="Read the prompt from a file ('-': stdin); a "
            ".jsonl file, or --each-line, runs every prompt in it.",
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
    rpc: RpcOpt = None,
    rpc_local_head: LocalHeadOpt = True,
    verbose: VerboseOpt = False,
) -> None:
    """Generate text from a prompt, with speculative decoding."""
    from dataclasses import replace

    from specgen.core.sampling import SamplingParams
    from specgen.engine import GenerationConfig
    from specgen.session.decide import decide
    from specgen.session.generate import wants_chat
    from specgen.session.pair import PairOptions, open_pair
    from specgen.session.prompts import unescape

    esc = unescape if escapes else (lambda text: text)
    batch = each_line or jsonl or (file is not None and file.suffix in (".jsonl", ".ndjson"))
    if (output is not None or resume) and not batch:
        raise UsageError(
            "--output and --resume are for batches: add --each-line, or give a .jsonl --file"
        )
    if resume and output is None:
        raise UsageError("--resume needs --output FILE (the results to resume from)")
    if batch:
        items = read_batch(prompt, file, each_line, jsonl)
        sink = open_output(output)
    else:
        text = _read_prompt(None if prompt is None else esc(prompt), file)
    try:
        sampling = SamplingParams(temperature, top_k, top_p, min_p)
    except ValueError as err:  # the open ends of the ranges the options already check
        raise UsageError(str(err).replace("top_p", "--top-p").replace("min_p", "--min-p")) from err
    config = GenerationConfig(
        lookahead=0,
        sampling=sampling,
        max_tokens=max_tokens,
        stop=tuple(esc(s) for s in stop or ()),
        seed=seed,
        grammar=grammar.from_options(json_schema, grammar_text, output_format),
        logit_bias=_logit_bias(logit_bias or []),
        logprobs=logprobs,
    )
    options = PairOptions(
        n_ctx=ctx_size,
        target_threads=target_threads or threads,
        draft_threads=draft_threads or threads,
        target_gpu_layers=gpu_layers if target_gpu_layers is None else target_gpu_layers,
        draft_gpu_layers=gpu_layers if draft_gpu_layers is None else draft_gpu_layers,
        verbose=verbose,
        local_head=rpc_local_head,
    )
    keep, lookup_file = lookup_cache_of(lookup_cache)
    options = replace(options, lookup_cache=keep, lookup_file=lookup_file)
    decision = decide(
        pair,
        target,
        draft,
        ngram=ngram,
        mtp=mtp,
        lookahead=lookahead_of(lookahead),
        rpc=rpc,
        threads=options.target_threads,
        gpu_layers=options.target_gpu_layers,
        bench_temperature=sampling.temperature,
        explain_alone=True,
    )
    loaded = open_pair(decision, options)
    for note in loaded.notes:
        out.warning(note)
    config = replace(config, lookahead=decision.lookahead)
    system_text = None if system is None else esc(system)
    use_chat = wants_chat(loaded, decision.chat, chat, system_text)
    if batch:
        code = run_batch_shown(
            loaded,
            config,
            items,
            sink,
            output,
            resume,
            use_chat,
            system_text,
            draft_p_min,
            no_stats,
        )
        if code == EXIT_INTERRUPTED:
            raise Interrupted()
        raise typer.Exit(code)
    _single(decision, loaded, config, text, use_chat, system_text, draft_p_min, json_out, no_stats)


def _read_prompt(argument: str | None, file: Path | None) -> str:
    """The prompt from the argument, a file (``-``: stdin), or both the argument and piped
    stdin; the one newline a file or ``echo`` ends with is dropped."""
    from specgen.session.prompts import combine, read_file, stdin_is_piped, strip_final_newline

    if argument is not None and file is not None:
        raise UsageError("give the prompt either as an argument or with --file, not both")
    if file is not None:
        text: str | None = strip_final_newline(read_file(file))
    else:
        piped = sys.stdin.read() if stdin_is_piped() else None
        text = combine(argument, None if piped is None else strip_final_newline(piped))
    if text is None:
        raise UsageError(
            "no prompt: give one as an argument, with -f FILE, or on stdin "
            "(e.g. cat prompt.txt | specgen run ...)"
        )
    if not text.strip():
        raise UsageError("the prompt is empty: give some text to continue")
    return text


def _single(
    decision: Decision,
    loaded: Pair,
    config: GenerationConfig,
    text: str,
    chat: bool,
    system: str | None,
    draft_p_min: float,
    json_out: bool,
    no_stats: bool,
) -> None:
    from specgen.cli.live import StreamView
    from specgen.session.generate import generate, new_stats

    if decision.note and not (no_stats or json_out):
        out.note(decision.note)
    stats = new_stats(loaded, config, draft_p_min)
    with StreamView(stats, show_stats=not no_stats and not json_out) as view:
        result = generate(
            loaded,
            text,
            config,
            chat=chat,
            system=system,
            draft_p_min=draft_p_min,
            stats=stats,
            on_text=None if json_out else view.write,
        )
    if stats.stop_reason == "context_full":
        out.warning(
            f"stopped: the context window ({loaded.target.n_ctx} tokens) is full; "
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
        out.json({**result.as_dict(), **_run_facts(decision, loaded, config, draft_p_min, chat)})
    if result.interrupted:
        raise Interrupted()


def _run_facts(
    decision: Decision, loaded: Pair, config: GenerationConfig, draft_p_min: float, chat: bool
) -> dict[str, object]:
    """What ran, for ``--json``: the models, the settings and the context."""
    sampling = config.sampling
    return {
        "pair": decision.name,
        "target": str(loaded.target.path),
        "draft": str(loaded.draft.path) if loaded.draft else None,
        "ngram": loaded.ngram,
        "mtp": loaded.mtp,
        "rollback": loaded.rollback_facts(),
        "params": {
            "lookahead": config.lookahead,
            "draft_p_min": draft_p_min,
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "min_p": sampling.min_p,
            "max_tokens": config.max_tokens,
            "stop": list(config.stop),
            "chat": chat,
            "n_ctx": loaded.target.n_ctx,
        },
    }


def _logit_bias(given: list[str]) -> LogitBias | None:
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
