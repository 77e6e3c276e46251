"""Workers (llama.cpp's RPC backend), the pure checks: endpoints, the handshake against fake
servers, models.toml and the command line. Real workers with the demo models are in
tests/integration/test_rpc.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specgen.errors import UsageError
from specgen.host import rpc
from tests.conftest import free_port
from tests.invoke import (
    one_line_error,
    specgen_here,
)
from tests.rpc_helpers import fake_server, hello_reply


# -- addresses ---------------------------------------------------------------------------------
def test_endpoints_parse_as_llama_cpp_reads_them() -> None:
    assert rpc.parse_endpoint("10.0.0.2:50053") == rpc.Endpoint("10.0.0.2", 50053)
    assert rpc.parse_endpoint(" big-box ") == rpc.Endpoint("big-box", rpc.DEFAULT_PORT)
    assert [str(e) for e in rpc.parse_endpoints("a:1,b")] == ["a:1", f"b:{rpc.DEFAULT_PORT}"]
    for bad, says in (
        ("", "no host"),
        (":50052", "no host"),
        ("a:0", "port"),
        ("a:x", "port"),
        ("a:70000", "port"),
        ("[::1]:50052", "IPv4"),
        ("::1", "IPv4"),
        ("a:1,a:1", "twice"),
    ):
        with pytest.raises(UsageError, match=says):
            rpc.parse_endpoints(bad)
    assert rpc.listen_address("localhost") == "127.0.0.1"
    assert rpc.listen_address("0.0.0.0") == "0.0.0.0"
    with pytest.raises(UsageError, match="IPv4"):
        rpc.listen_address("big-box")


def test_the_protocol_version_is_the_installed_header_s() -> None:
    import llama_cpp

    header = Path(llama_cpp.__file__).parent.parent / "include" / "ggml-rpc.h"
    text = header.read_text()
    found = tuple(
        int(text.split(f"RPC_PROTO_{part}_VERSION")[1].split()[0])
        for part in ("MAJOR", "MINOR", "PATCH")
    )
    assert found == rpc.PROTOCOL


# -- the handshake, against fake servers ---------------------------------------------------------
def test_hello_reads_the_version_and_times_the_round_trip() -> None:
    with fake_server(hello_reply(rpc.PROTOCOL)) as endpoint:
        found = rpc.hello(endpoint)
    assert found.version == rpc.PROTOCOL and 0 < found.round_trip_s < 5


@pytest.mark.parametrize(
    "version",
    [
        (rpc.PROTOCOL[0] + 1, 0, 0),
        (rpc.PROTOCOL[0] - 1, 0, 0),
        (rpc.PROTOCOL[0], rpc.PROTOCOL[1] + 1, 0),
    ],
)
def test_a_worker_of_another_version_is_one_line(version: tuple[int, int, int]) -> None:
    with fake_server(hello_reply(version)) as endpoint:
        with pytest.raises(
            rpc.WorkerError,
            match=r"speaks RPC protocol .*same "
            r"llama-cpp-python version",
        ):
            rpc.hello(endpoint)


def test_nothing_listening_a_silent_server_and_a_stranger_are_one_line_each() -> None:
    with pytest.raises(rpc.WorkerError, match="nothing is listening at .*specgen worker"):
        rpc.hello(rpc.Endpoint("127.0.0.1", free_port()))
    with fake_server(lambda conn: None) as endpoint:  # accepts, never answers: busy
        with pytest.raises(rpc.WorkerError, match="serving another client"):
            rpc.hello(endpoint, timeout=0.5)
    with fake_server(lambda conn: conn.close()) as endpoint:
        with pytest.raises(rpc.WorkerError, match="closed the connection"):
            rpc.hello(endpoint)


def test_an_abort_becomes_one_line_naming_the_workers() -> None:
    died = rpc.abort_line(
        "ggml-rpc.cpp:566: Remote RPC server crashed or returned malformed response",
        ["10.0.0.2:50052"],
    )
    assert "lost the connection to the RPC worker (10.0.0.2:50052) mid-run" in died
    assert "restart `specgen worker`" in died
    other = rpc.abort_line("ggml.c:1: GGML_ASSERT(x) failed", ["a:1"])
    assert other.endswith("GGML_ASSERT(x) failed") and "\n" not in other


# -- models.toml and the command line --------------------------------------------------------
def test_pairs_may_name_workers_and_rpc_none_runs_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specgen.backend import runtime
    from specgen.models.registry import Registry
    from specgen.session.choice import choose

    home = Path(os.environ["SPECGEN_HOME"])
    (home / "models.toml").write_text(
        '[pairs.far]\ntarget = { path = "t.gguf" }\ndraft = { path = "d.gguf" }\n'
        'rpc = ["127.0.0.1:1", "127.0.0.1:2"]\n'
    )
    registry = Registry.load()
    assert registry.pair("far").workers == ("127.0.0.1:1", "127.0.0.1:2")
    assert choose(registry, "far", None, None, rpc="none").workers == ()
    monkeypatch.setattr(runtime, "supports_rpc", lambda: True)
    with pytest.raises(rpc.WorkerError, match="nothing is listening at 127.0.0.1:1"):
        choose(registry, "far", None, None)  # probed before anything loads
    (home / "models.toml").write_text(
        '[pairs.far]\ntarget = { path = "t.gguf" }\ndraft = { path = "d.gguf" }\nrpc = 5\n'
    )
    with pytest.raises(Exception, match="'rpc' must be"):
        Registry.load()


def test_a_build_without_rpc_says_how_to_rebuild(monkeypatch: pytest.MonkeyPatch) -> None:
    from specgen.backend import runtime

    monkeypatch.setattr(runtime, "supports_rpc", lambda: False)
    for args in (["worker"], ["run", "--target", "t.gguf", "--rpc", "127.0.0.1:1", "hi"]):
        one_line_error(specgen_here(*args), "-DGGML_RPC=ON")


def test_a_worker_beyond_loopback_warns_that_the_protocol_is_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from specgen import backend
    from specgen.backend import runtime
    from specgen.cli import worker as cli_worker

    monkeypatch.setattr(runtime, "supports_rpc", lambda: True)  # whatever this build has
    monkeypatch.setattr(cli_worker, "_check_port_free", lambda endpoint: None)
    monkeypatch.setattr(cli_worker, "_show_server_events", lambda verbose: None)
    monkeypatch.setattr(backend, "serve_worker", lambda *args: None)  # as if it could not bind
    done = specgen_here("worker", "--host", "0.0.0.0")
    err = " ".join(done.stderr.split())
    assert "no authentication" in err and "network you trust" in err
    assert "could not listen at 0.0.0.0:50052" in err and done.returncode == 1
    done = specgen_here("worker", "--host", "127.0.0.1")
    assert "no authentication" not in done.stderr and done.returncode == 1
    assert "authentication" in specgen_here("worker", "--help").stdout


def test_bench_s_pasteable_command_keeps_the_workers() -> None:
    from specgen.bench.report import BenchSetting, Report
    from specgen.cli.bench_report import _workers_option

    def option(workers: tuple[str, ...], local_head: bool = True) -> str:
        setting = BenchSetting("p", None, {}, None, {}, {}, workers, local_head)
        return _workers_option(Report(1.0, 1.0, [], None, setting=setting))

    assert option(("a:1", "b:2")) == " --rpc a:1,b:2"
    assert option(("a:1",), local_head=False) == " --rpc a:1 --no-rpc-local-head"
    assert option(()) == ""
    assert _workers_option(Report(1.0, 1.0, [], None)) == ""


def test_without_the_rpc_build_its_tests_skip_saying_how_unless_ci_requires_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from tests import conftest

    item = SimpleNamespace(get_closest_marker=lambda name: name == "needs_rpc" or None)
    monkeypatch.setattr(conftest, "_built_with", lambda flag: False)
    monkeypatch.delenv("SPECGEN_REQUIRE_BUILD_OPTIONS", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r'CMAKE_ARGS="-DGGML_RPC=ON" pip install'):
        conftest.pytest_runtest_setup(item)  # type: ignore[arg-type]
    monkeypatch.setenv("SPECGEN_REQUIRE_BUILD_OPTIONS", "1")  # as .ci/run sets it
    with pytest.raises(pytest.fail.Exception, match="the build must have it"):
        conftest.pytest_runtest_setup(item)  # type: ignore[arg-type]
    monkeypatch.setattr(conftest, "_built_with", lambda flag: True)
    conftest.pytest_runtest_setup(item)  # type: ignore[arg-type]  # built with it: it runs
