"""``specgen serve``: the OpenAI-compatible server (``specgen.server``) from the command line."""

from __future__ import annotations

from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from specgen.cli.options import (
    PERFORMANCE,
    CtxOpt,
    DraftOpt,
    DraftPMinOpt,
    GpuLayersOpt,
    LocalHeadOpt,
    LookaheadOpt,
    LookupCacheOpt,
    MtpOpt,
    NgramOpt,
    PairOpt,
    RpcOpt,
    ServeParallelOpt,
    TargetOpt,
    ThreadsOpt,
    VerboseOpt,
    busy_threads_of,
    lookahead_of,
    lookup_cache_of,
)
from specgen.cli.output import out
from specgen.engine import DEFAULT_MAX_TOKENS
from specgen.errors import UserError

if TYPE_CHECKING:
    import uvicorn

    from specgen.server.queue import GenerationQueue, SlotQueue

SERVER = "Server"


def serve(
    pair: PairOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    lookahead: LookaheadOpt = None,
    ngram: NgramOpt = None,
    lookup_cache: LookupCacheOpt = None,
    mtp: MtpOpt = None,
    draft_p_min: DraftPMinOpt = 0.0,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            metavar="ADDRESS",
            help="Address to listen on (0.0.0.0: every interface).",
            rich_help_panel=SERVER,
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option("--port", min=0, max=65535, help="Port to listen on.", rich_help_panel=SERVER),
    ] = 8080,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            metavar="KEY",
            envvar="SPECGEN_API_KEY",
            help="Require 'Authorization: "
            "Bearer KEY' on /v1/ (default: $SPECGEN_API_KEY; none: open).",
            show_default=False,
            rich_help_panel=SERVER,
        ),
    ] = None,
    queue: Annotated[
        int,
        typer.Option(
            "--queue",
            min=0,
            help="Requests that may wait while one generates; past that, 503.",
            rich_help_panel=SERVER,
        ),
    ] = 8,
    max_tokens: Annotated[
        int,
        typer.Option(
            "--max-tokens",
            "-n",
            min=1,
            help="New tokens per request when it does not say.",
            rich_help_panel=SERVER,
        ),
    ] = DEFAULT_MAX_TOKENS,
    max_tokens_limit: Annotated[
        int | None,
        typer.Option(
            "--max-tokens-limit",
            metavar="N",
            min=1,
            help="The most new tokens any request gets (a larger max_tokens is lowered to "
            "it); past the context, a request is refused (default: the context).",
            show_default=False,
            rich_help_panel=SERVER,
        ),
    ] = None,
    access_log: Annotated[
        bool,
        typer.Option(
            "--access-log/--no-access-log",
            help="One line per request on stderr: status, tokens, tok/s, acceptance.",
            rich_help_panel=SERVER,
        ),
    ] = True,
    threads: ThreadsOpt = 0,
    gpu_layers: GpuLayersOpt = -1,
    ctx_size: CtxOpt = 0,
    parallel: ServeParallelOpt = None,
    balance: Annotated[
        bool,
        typer.Option(
            "--balance/--no-balance",
            help="Requests sent together (a burst: parallel tool calls, a batch) end "
            "together once one of them has ended and its place stayed free (its sender waits "
            "for the rest): while none waits for a slot, one ahead of another of its burst "
            "(fewer tokens left to its max_tokens) guesses nothing while it would still end "
            "no later than the slowest at its pace, so the burst ends sooner; not while "
            "clients send their next request as soon as they have an answer. --no-balance: "
            "each request guesses for its own latency.",
            rich_help_panel=PERFORMANCE,
        ),
    ] = True,
    rpc: RpcOpt = None,
    rpc_local_head: LocalHeadOpt = True,
    verbose: VerboseOpt = False,
) -> None:
    """Serve the pair over an OpenAI-compatible HTTP API (chat, completions, metrics)."""
    try:
        import uvicorn

        from specgen.server import create_app
    except ImportError as error:
        raise UserError("specgen serve needs its extra: pip install 'specgen[server]'") from error
    from specgen.api import Specgen

    generator = Specgen(
        pair,
        target,
        draft,
        lookahead=lookahead_of(lookahead),
        ngram=ngram,
        mtp=mtp,
        n_ctx=ctx_size,
        threads=threads,
        busy_threads=busy_threads_of(threads),
        gpu_layers=gpu_layers,
        draft_p_min=draft_p_min,
        verbose=verbose,
        progress=True,
        from_bench=True,
        rpc=rpc,
        rpc_local_head=rpc_local_head,
        lookup_cache=lookup_cache_of(lookup_cache),
        parallel="auto" if parallel is None else parallel,
    )
    parallel = generator.parallel
    if generator.note:
        out.note(generator.note)
    for note in generator.pair.notes:
        out.warning(note)
    app = create_app(
        generator,
        api_key=api_key,
        max_queue=queue,
        default_max_tokens=max_tokens,
        parallel=parallel,
        n_ctx=generator.pair.target.n_ctx,
        max_tokens_limit=max_tokens_limit,
        access_log=(lambda line: out.note(line)) if access_log else None,
        balance=balance,
    )
    where = f"http://{host}:{port}/v1"
    out.note(
        f"specgen serve: {generator.name} (K={generator.lookahead}"
        + (f", {parallel} at once" if parallel > 1 else "")
        + f") at {where}"
        + ("" if api_key else "; no API key")
        + "; Ctrl-C to stop",
        style=None,
    )
    _server(
        uvicorn.Config(
            app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=10
        ),
        app.state.queue,
    ).run()


def _server(config: uvicorn.Config, queue: GenerationQueue | SlotQueue) -> uvicorn.Server:
    """uvicorn's server, told to end in-flight generations at once when asked to stop (Ctrl-C,
    SIGTERM), so their streams close with a final event instead of running to the end."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            queue.draining.set()
            super().handle_exit(sig, frame)

    return Server(config)
