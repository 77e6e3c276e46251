"""``specgen worker``: serve this machine's CPU (or GPUs) to other machines' ``--rpc``.

It is llama.cpp's RPC server, started from the wheel's own libraries (no C++ build). ggml's
server writes its events to C's stdout; the worker reads them through a pipe and shows them as
timestamped lines on stderr. The server call never returns while it serves, so it runs on a
thread and the main thread waits for Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from typing import Annotated

import typer
from rich.markup import escape

from specgen.cli.options import PERFORMANCE, VerboseOpt
from specgen.cli.output import out, size
from specgen.errors import UserError
from specgen.host import rpc

_CONNECTED, _CLOSED = "Accepted client connection", "Client connection closed"
_SHORT_S = 1.0


def worker(
    host: Annotated[
        str,
        typer.Option(
            "--host",
            metavar="ADDRESS",
            help="IPv4 address to listen on. Beyond 127.0.0.1 "
            "(0.0.0.0: every interface) anyone who can reach the port can use this machine: the "
            "RPC protocol has no authentication.",
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")
    ] = 50052,
    threads: Annotated[
        int,
        typer.Option(
            "--threads",
            "-t",
            min=0,
            help="CPU threads for the clients' computations (0: physical cores).",
            rich_help_panel=PERFORMANCE,
        ),
    ] = 0,
    cache: Annotated[
        bool,
        typer.Option(
            "--cache/--no-cache",
            help="Keep the tensors clients send in a local cache "
            "(SPECGEN_CACHE/rpc), so the next load of the same model sends hashes, not weights.",
        ),
    ] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Serve this machine's CPU (or GPUs) to `specgen run|bench|serve --rpc` elsewhere.

    The RPC protocol has no authentication or encryption: listen beyond 127.0.0.1 only on a
    network you trust.
    """
    from specgen import backend
    from specgen.host.machine import default_threads
    from specgen.host.store import cache_root

    address = rpc.listen_address(host)
    endpoint = rpc.Endpoint(address, port)
    backend.require_rpc()
    _check_port_free(endpoint)
    if not endpoint.is_loopback:
        out.err.print(
            f"[bold yellow]warning:[/] listening on {escape(address)}: "
            f"{rpc.SECURITY_NOTE}. Use this only on a network you trust.",
            highlight=False,
            soft_wrap=True,
        )
    cache_dir = cache_root() / "rpc" if cache else None
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
    _banner(endpoint, backend.served_devices(), threads or default_threads(), cache_dir)
    _show_server_events(verbose)
    server = threading.Thread(
        target=backend.serve_worker,
        args=(str(endpoint), threads, str(cache_dir) if cache_dir else None),
        daemon=True,
        name="rpc-server",
    )
    signal.signal(signal.SIGTERM, _stop)
    server.start()
    try:
        while server.is_alive():
            server.join(0.5)
    except KeyboardInterrupt:
        out.err.print("worker stopped", style="yellow")
        sys.stderr.flush()
        os._exit(0)  # the server thread is inside C and cannot be asked to return
    raise UserError(
        f"the worker could not listen at {endpoint} (run with -v for llama.cpp's reason)"
    )


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _check_port_free(endpoint: rpc.Endpoint) -> None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ggml's server does
    try:
        probe.bind((endpoint.host, endpoint.port))
    except OSError as error:
        raise UserError(
            f"cannot listen at {endpoint}: {error.strerror} (another worker there? "
            f"pick another --port)"
        ) from None
    finally:
        probe.close()


def _banner(endpoint: rpc.Endpoint, devices: list, threads: int, cache_dir: object) -> None:
    out.err.print(
        f"specgen worker at [bold]{endpoint}[/] (RPC protocol "
        f"{'.'.join(map(str, rpc.PROTOCOL))}), {threads} thread{'s' if threads != 1 else ''}"
        + (f", cache {cache_dir}" if cache_dir else ""),
        highlight=False,
        soft_wrap=True,
    )
    for device in devices:
        out.err.print(
            f"  {escape(device.name)}: {escape(device.description)} "
            f"({size(device.free_bytes)} free of {size(device.total_bytes)})",
            highlight=False,
            soft_wrap=True,
        )
    host = endpoint.host if endpoint.host != "0.0.0.0" else "THIS-HOST"
    out.err.print(
        f"use it with: specgen run --rpc {host}:{endpoint.port} ... (one client at a "
        f"time); Ctrl-C to stop",
        style="dim",
        highlight=False,
        soft_wrap=True,
    )


def _show_server_events(verbose: bool) -> None:
    """Route C's stdout (where ggml's server prints) through a pipe: its connection events
    become timestamped lines on stderr, its start-up banner is dropped (ours says the same).

    A client's handshakes and device queries are connections of a few milliseconds each; only
    a connection that lasts past ``_SHORT_S`` (a model loaded) is shown, unless ``verbose``.
    """
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    os.dup2(write_end, 1)
    os.close(write_end)

    def say(event: str) -> None:
        out.err.print(f"{time.strftime('%H:%M:%S')} {event}", highlight=False)

    def pump() -> None:
        pending: threading.Timer | None = None
        since = 0.0
        with os.fdopen(read_end, "r", errors="replace") as lines:
            for line in lines:
                text = line.strip()
                if text == _CONNECTED:
                    since = time.monotonic()
                    pending = threading.Timer(
                        0 if verbose else _SHORT_S, say, ("client connected",)
                    )
                    pending.start()
                elif text == _CLOSED:
                    if pending is not None:
                        pending.cancel()
                    lasted = time.monotonic() - since
                    if verbose or lasted >= _SHORT_S:
                        say(f"client disconnected after {lasted:.1f} s")
                elif verbose and text:
                    out.err.print(text, style="dim", highlight=False, markup=False)

    threading.Thread(target=pump, daemon=True, name="rpc-events").start()
