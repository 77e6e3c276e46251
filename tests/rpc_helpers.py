"""Workers for tests and benchmarks: a real `specgen worker` on 127.0.0.1, a byte-counting TCP
proxy to put in front of one (how many bytes a load and a verify send, each way), and fake
servers that answer the RPC handshake as a test scripts them."""

from __future__ import annotations

import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from specgen.host import rpc
from tests.conftest import free_port
from tests.invoke import specgen_popen


def wait_for_worker(
    endpoint: str, proc: subprocess.Popen | None = None, timeout: float = 60.0
) -> None:
    """Until the worker answers its handshake (it has started listening)."""
    from specgen.host.rpc import hello, parse_endpoint

    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the worker exited: {proc.communicate()[1]}")
        try:
            hello(parse_endpoint(endpoint), timeout=2)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@contextmanager
def worker(*extra: str, threads: int = 1) -> Iterator[tuple[str, subprocess.Popen]]:
    """A `specgen worker` subprocess on a free loopback port; stopped on the way out."""
    port = free_port()
    proc = specgen_popen(
        "worker",
        "--port",
        str(port),
        "--threads",
        str(threads),
        *extra,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    endpoint = f"127.0.0.1:{port}"
    try:
        wait_for_worker(endpoint, proc)
        yield endpoint, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class CountingProxy:
    """Forwards 127.0.0.1:port to a worker, counting the bytes each way over all connections."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.sent = 0  # client -> worker (weights, graphs, inputs)
        self.received = 0  # worker -> client (results: logits or hidden states)
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return self.sent, self.received

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            worker_side = socket.create_connection(self.upstream)
            for sock in (client, worker_side):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(
                target=self._pipe, args=(client, worker_side, "sent"), daemon=True
            ).start()
            threading.Thread(
                target=self._pipe, args=(worker_side, client, "received"), daemon=True
            ).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, counter: str) -> None:
        try:
            while data := src.recv(1 << 20):
                dst.sendall(data)
                with self._lock:
                    setattr(self, counter, getattr(self, counter) + len(data))
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._server.close()


@contextmanager
def fake_server(answer) -> Iterator[rpc.Endpoint]:
    """A TCP server whose every connection is handed to ``answer(conn)``."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            answer(conn)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield rpc.Endpoint("127.0.0.1", server.getsockname()[1])
    finally:
        server.close()
        for conn in held:
            conn.close()


def hello_reply(version: tuple[int, int, int]):
    def answer(conn: socket.socket) -> None:
        request = conn.recv(1 + 8 + 24)
        assert request[0] == 14 and struct.unpack("<Q", request[1:9])[0] == 24
        conn.sendall(struct.pack("<Q", 28) + bytes(version) + bytes(25))

    return answer
