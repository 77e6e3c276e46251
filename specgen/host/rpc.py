"""Workers: llama.cpp's RPC backend, seen from before ggml gets a chance to abort the process.

A target too big for this machine can put its layers on `specgen worker` processes elsewhere
(llama.cpp's ``rpc-server`` protocol). ggml's client aborts the whole process on any failure
(nothing listening, a failed handshake, a worker that dies mid-run), which Python cannot catch. So
this module owns what can be checked first, in plain Python: the endpoint syntax, and the
protocol's HELLO (is anything listening, is it free, does it speak our version), each failure as
one line. It also turns the message of an abort that could not be prevented (a worker that died
mid-run) into one line. ``backend`` attaches the workers; this module must not import llama_cpp.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass

from specgen.errors import UsageError, UserError

DEFAULT_PORT = 50052
# The protocol the bundled llama.cpp speaks (RPC_PROTO_*_VERSION in ggml-rpc.h; a test checks
# them against the installed header). A worker must have the same major and no newer minor.
PROTOCOL = (7, 0, 0)
PROBE_TIMEOUT_S = 5.0
_HELLO = 14  # RPC_CMD_HELLO, fixed by the protocol for every version
_CAPS_SIZE = 24  # the connection-capabilities block that HELLO carries both ways
_HELLO_REPLY = 4 + _CAPS_SIZE  # major, minor, patch, padding, then the capabilities
SECURITY_NOTE = (
    "the RPC protocol has no authentication and no encryption: anyone who can reach "
    "the port can run code on this machine's backend and read what it computes"
)


class WorkerError(UserError):
    """A worker that cannot serve this run; the message names it and says what to do."""


@dataclass(frozen=True)
class Endpoint:
    """One worker's address, ``host:port`` (llama.cpp's RPC speaks IPv4 only)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        return self.host == "localhost" or self.host.startswith("127.")


def parse_endpoint(text: str) -> Endpoint:
    """``host:port``, or ``host`` alone for the default port; a usage error otherwise."""
    raw = text.strip()
    host, _, port_text = raw.partition(":")
    if raw.count(":") > 1 or raw.startswith("["):
        raise UsageError(
            f"cannot read the worker address {text!r}: llama.cpp's RPC speaks "
            f"IPv4 only, so write a name or an IPv4 address, HOST:PORT"
        )
    if not host:
        raise UsageError(f"the worker address {text!r} has no host: write HOST:PORT")
    if not port_text:
        return Endpoint(host, DEFAULT_PORT)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(f"the worker address {text!r} has no valid port (1-65535)")
    return Endpoint(host, int(port_text))


def listen_address(host: str) -> str:
    """The IPv4 address a worker binds (ggml's server takes a literal address only)."""
    if host == "localhost":
        return "127.0.0.1"
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        raise UsageError(
            f"--host {host!r} is not an IPv4 address: give 127.0.0.1 (this machine "
            f"only), 0.0.0.0 (every interface) or one of this machine's "
            f"addresses"
        ) from None


def parse_endpoints(spec: str | Iterable[str]) -> tuple[Endpoint, ...]:
    """Workers from ``host:port[,host:port...]`` (or a list of them), each once."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    endpoints = tuple(parse_endpoint(item) for item in items)
    seen: set[Endpoint] = set()
    for endpoint in endpoints:
        if endpoint in seen:
            raise UsageError(f"the worker {endpoint} is named twice: name each worker once")
        seen.add(endpoint)
    return endpoints


@dataclass(frozen=True)
class Hello:
    """What a worker answered: its protocol version and how long the handshake took."""

    endpoint: Endpoint
    version: tuple[int, int, int]
    round_trip_s: float


def hello(endpoint: Endpoint, timeout: float = PROBE_TIMEOUT_S) -> Hello:
    """Connect, say HELLO, check the version: every failure ggml would abort on, as one line."""
    start = time.perf_counter()
    try:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
    except ConnectionRefusedError:
        raise WorkerError(
            f"nothing is listening at {endpoint}: start `specgen worker --host "
            f"{endpoint.host} --port {endpoint.port}` there, or check the address"
        ) from None
    except TimeoutError:
        raise WorkerError(
            f"{endpoint} did not answer within {timeout:g} s: check the address, "
            f"that the machine is up and that no firewall blocks the port"
        ) from None
    except OSError as err:
        raise WorkerError(f"cannot reach the worker {endpoint}: {err.strerror or err}") from None
    with sock:
        try:
            sock.sendall(bytes([_HELLO]) + struct.pack("<Q", _CAPS_SIZE) + bytes(_CAPS_SIZE))
            (size,) = struct.unpack("<Q", _recv_exactly(sock, 8))
            if size != _HELLO_REPLY:
                raise ConnectionError("unexpected reply size")
            reply = _recv_exactly(sock, size)
        except TimeoutError:
            raise WorkerError(
                f"the worker {endpoint} accepted the connection but did not answer "
                f"within {timeout:g} s: it is serving another client (a worker "
                f"serves one at a time); stop that client or start another worker"
            ) from None
        except OSError:
            raise WorkerError(
                f"{endpoint} closed the connection during the handshake: it is not "
                f"a specgen or llama.cpp RPC worker, or one too old to speak "
                f"protocol {_version(PROTOCOL)}"
            ) from None
    round_trip = time.perf_counter() - start
    version = (reply[0], reply[1], reply[2])
    check_version(endpoint, version)
    return Hello(endpoint, version, round_trip)


def check_version(endpoint: Endpoint, version: tuple[int, int, int]) -> None:
    """ggml's rule: the same major version, and a worker's minor no newer than ours."""
    if version[0] != PROTOCOL[0] or version[1] > PROTOCOL[1]:
        raise WorkerError(
            f"the worker {endpoint} speaks RPC protocol {_version(version)}, this "
            f"machine's llama.cpp speaks {_version(PROTOCOL)}: install the same "
            f"llama-cpp-python version on both machines"
        )


def probe(endpoints: Iterable[Endpoint], timeout: float = PROBE_TIMEOUT_S) -> list[Hello]:
    """HELLO every worker before ggml connects for good; the first failure is raised."""
    return [hello(endpoint, timeout) for endpoint in endpoints]


def abort_line(message: str, endpoints: Iterable[Endpoint | str]) -> str:
    """The one line for a ggml abort while workers were attached (``file:line: what``)."""
    what = message.split(": ", 1)[-1].strip()
    names = ", ".join(str(e) for e in endpoints) or "the worker"
    if "crashed or returned malformed response" in what:
        return (
            f"lost the connection to the RPC worker ({names}) mid-run: it stopped or the "
            f"network dropped; restart `specgen worker` there and run again"
        )
    if what.startswith(("Failed to connect", "RPC handshake failed")):
        return (
            f"could not attach the RPC worker ({names}): {what}; check that `specgen worker` "
            f"runs there with the same llama-cpp-python version"
        )
    return f"llama.cpp stopped with the RPC worker ({names}) attached: {what}"


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _version(version: tuple[int, int, int]) -> str:
    return ".".join(str(part) for part in version)
