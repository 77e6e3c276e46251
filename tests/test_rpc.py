"""Workers (llama.cpp's RPC backend): the pure checks on fakes, then real `specgen worker`s on
127.0.0.1 with the SmolLM2 demo models: output equal to the local target's, placement (the
draft and the output layer stay here, counted in bytes), and every failure as one line."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specgen import cli
from specgen.cli import app
from specgen.errors import UsageError
from specgen.host import rpc
from tests.conftest import free_port, with_models_cache
from tests.rpc_helpers import CountingProxy, wait_for_worker, worker

runner = CliRunner()


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


def main(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str]:
    """`specgen ARGS` in this process, through the entry point's error table: (code, stderr)."""
    monkeypatch.setattr(sys, "argv", ["specgen", *args])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    return int(exit_.value.code or 0), " ".join(capsys.readouterr().err.split())


def test_a_build_without_rpc_says_how_to_rebuild(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from specgen.backend import runtime

    monkeypatch.setattr(runtime, "supports_rpc", lambda: False)
    for args in (["worker"], ["run", "--target", "t.gguf", "--rpc", "127.0.0.1:1", "hi"]):
        code, err = main(monkeypatch, capsys, *args)
        assert code == 1 and err.startswith("error:") and "-DGGML_RPC=ON" in err, err
        assert "Traceback" not in err


def test_a_worker_beyond_loopback_warns_that_the_protocol_is_open(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from specgen import backend
    from specgen.backend import runtime
    from specgen.cli import worker as cli_worker

    monkeypatch.setattr(runtime, "supports_rpc", lambda: True)  # whatever this build has
    monkeypatch.setattr(cli_worker, "_check_port_free", lambda endpoint: None)
    monkeypatch.setattr(cli_worker, "_show_server_events", lambda verbose: None)
    monkeypatch.setattr(backend, "serve_worker", lambda *args: None)  # as if it could not bind
    code, err = main(monkeypatch, capsys, "worker", "--host", "0.0.0.0")
    assert "no authentication" in err and "network you trust" in err
    assert "could not listen at 0.0.0.0:50052" in err and code == 1
    code, err = main(monkeypatch, capsys, "worker", "--host", "127.0.0.1")
    assert "no authentication" not in err and code == 1
    assert "authentication" in runner.invoke(app, ["worker", "--help"]).output


# -- real workers --------------------------------------------------------------------------------
def run_json(
    target: Path,
    draft: Path | None,
    *extra: str,
    prompt: str = "The capital of France is",
    n: int = 24,
    env: dict[str, str] | None = None,
) -> dict:
    models = ["--target", str(target)] + (["--draft", str(draft)] if draft else [])
    args = [
        sys.executable,
        "-m",
        "specgen",
        "run",
        *models,
        "--raw",
        "--temperature",
        "0",
        "-n",
        str(n),
        "--threads",
        "1",
        "--json",
        *extra,
        prompt,
    ]
    done = subprocess.run(
        args,
        capture_output=True,
        text=True,
        env={**with_models_cache(), **(env or {})},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
@pytest.mark.needs_rpc
def test_greedy_through_one_and_two_workers_is_the_local_target_s(
    smollm2_target: Path, smollm2_draft: Path
) -> None:
    local = run_json(smollm2_target, None, "-k", "0")
    with worker() as (first, _), worker() as (second, _):
        one = run_json(smollm2_target, None, "-k", "0", "--rpc", first)
        two = run_json(smollm2_target, None, "-k", "0", "--rpc", f"{first},{second}")
        speculative = run_json(smollm2_target, smollm2_draft, "-k", "8", "--rpc", first)
        whole_head = run_json(
            smollm2_target, None, "-k", "0", "--rpc", first, "--no-rpc-local-head"
        )
    assert local["stats"]["generated_tokens"] == 24
    for remote in (one, two, speculative, whole_head):
        assert remote["text"] == local["text"] and remote["stats"]["generated_tokens"] == 24
    assert speculative["stats"]["cycles"] < 24 and speculative["stats"]["accepted"] > 0


@pytest.mark.slow
@pytest.mark.needs_rpc
def test_the_draft_and_the_output_layer_stay_on_this_machine(
    smollm2_target: Path, smollm2_draft: Path
) -> None:
    target_size, draft_size = smollm2_target.stat().st_size, smollm2_draft.stat().st_size
    traffic, texts = {}, {}
    ways = {
        "local head": ("--rpc-local-head", {}),
        "remote head": ("--no-rpc-local-head", {}),
        "remote head, whole rows": ("--no-rpc-local-head", {"SPECGEN_BACKEND_SAMPLING": "0"}),
    }
    with worker() as (endpoint, _):
        for way, (head, env) in ways.items():
            proxy = CountingProxy(endpoint)
            try:
                texts[way] = run_json(
                    smollm2_target, smollm2_draft, "-k", "4", "--rpc", proxy.endpoint, head,
                    n=32, env=env,
                )["text"]  # fmt: skip
                traffic[way] = proxy.counts()
            finally:
                proxy.close()
    assert len(set(texts.values())) == 1  # greedy: the same text every way
    sent_all, received_whole = traffic["remote head, whole rows"]
    sent_local, received_local = traffic["local head"]
    # The whole target went over, and not the draft (which would add its 98 MB).
    assert 0.9 * target_size < sent_all < target_size + draft_size / 2
    # With the output layer here, results are hidden states (576 floats a row), not logit rows
    # (49152 floats each): over ten times fewer bytes back, and the tied embedding stays here.
    assert received_local * 10 < received_whole
    assert sent_local < sent_all - 50 * 2**20
    # With the output layer there, the worker's backend takes each row's argmax: a token id a
    # row comes back, fewer bytes than even the hidden states.
    assert traffic["remote head"][1] < received_local


@pytest.mark.slow
@pytest.mark.needs_rpc
def test_failures_before_attaching_are_one_line_each(smollm2_target: Path) -> None:
    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "specgen",
                "run",
                "--target",
                str(smollm2_target),
                "-n",
                "4",
                *extra,
                "hi",
            ],
            capture_output=True,
            text=True,
            env=with_models_cache(),
            timeout=120,
        )

    nobody = run("--rpc", f"127.0.0.1:{free_port()}")
    assert nobody.returncode == 1 and "nothing is listening" in nobody.stderr
    with worker() as (endpoint, _):
        host, port = endpoint.split(":")
        occupant = socket.create_connection((host, int(port)))  # another client, mid-session
        occupant.sendall(bytes([14]) + struct.pack("<Q", 24) + bytes(24))
        occupant.recv(36)
        busy = run("--rpc", endpoint)
        occupant.close()
    assert busy.returncode == 1 and "serving another client" in busy.stderr
    with fake_server(hello_reply((rpc.PROTOCOL[0] + 1, 0, 0))) as stranger:
        mismatch = run("--rpc", str(stranger))
    assert mismatch.returncode == 1 and "speaks RPC protocol" in mismatch.stderr
    for done in (nobody, busy, mismatch):
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert done.stdout == ""


@pytest.mark.slow
@pytest.mark.needs_rpc
def test_a_worker_killed_mid_run_ends_the_run_with_one_line(
    smollm2_target: Path, tmp_path: Path
) -> None:
    with worker() as (endpoint, worker_proc):
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "specgen",
                "run",
                "--target",
                str(smollm2_target),
                "--raw",
                "-k",
                "0",
                "-n",
                "3000",
                "--ctx-size",
                "4096",
                "--rpc",
                endpoint,
                "Once upon a time",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=with_models_cache(),
            cwd=tmp_path,
        )
        first = run.stdout.read(1)  # generating: text is coming
        worker_proc.kill()
        rest, errors = run.communicate(timeout=120)
    text = errors.decode()
    assert first and run.returncode == 1, text
    assert "lost the connection to the RPC worker" in text and "Traceback" not in text
    assert "GGML" not in text and len(text.strip().splitlines()) == 1
    assert not list(tmp_path.glob("core*"))


@pytest.mark.slow
@pytest.mark.needs_rpc
def test_a_worker_stops_cleanly_and_shows_what_it_serves() -> None:
    with worker() as (endpoint, proc):
        host, port = endpoint.split(":")
        held = socket.create_connection((host, int(port)))
        held.sendall(bytes([14]) + struct.pack("<Q", 24) + bytes(24))
        held.recv(36)
        time.sleep(2.5)  # a session, not a probe (1 s at least): the worker shows it
        held.close()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert f"specgen worker at {endpoint}" in err and "CPU" in err
    assert "client connected" in err and "client disconnected after" in err
    assert "worker stopped" in err and out == ""
    with worker() as (endpoint, _):
        port = endpoint.split(":")[1]
        clash = subprocess.run(
            [sys.executable, "-m", "specgen", "worker", "--port", port],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert clash.returncode == 1 and "pick another --port" in clash.stderr


@pytest.mark.slow
@pytest.mark.needs_rpc
def test_doctor_lists_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    with worker() as (endpoint, _):
        done = subprocess.run(
            [sys.executable, "-m", "specgen", "doctor", "--json", "--rpc", endpoint],
            capture_output=True,
            text=True,
            timeout=120,
        )
        wait_for_worker(endpoint)  # doctor let go of it
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)["workers"]
    assert found[0]["endpoint"] == endpoint and found[0]["protocol"] == "7.0.0"
    assert found[0]["round_trip_ms"] > 0 and found[0]["devices"][0]["total_bytes"] > 0


@pytest.mark.slow
@pytest.mark.needs_rpc
def test_bench_measures_the_verify_over_the_workers(
    smollm2_target: Path, smollm2_draft: Path, tmp_path: Path
) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The capital of France is\n")
    with worker() as (endpoint, _):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "specgen",
                "bench",
                "--target",
                str(smollm2_target),
                "--draft",
                str(smollm2_draft),
                "-k",
                "2",
                "-n",
                "8",
                "--temperature",
                "0",
                "--prompts",
                str(prompts),
                "--threads",
                "1",
                "--rpc",
                endpoint,
                "--json",
                str(tmp_path / "bench.json"),
            ],
            capture_output=True,
            text=True,
            env=with_models_cache(),
            timeout=300,
        )
    assert done.returncode == 0, done.stderr
    shown = " ".join(done.stdout.split())  # the title wraps at the table's width
    assert f"target on {endpoint}" in shown and "RPC workers" in shown
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["meta"]["target"]["workers"] == [endpoint]


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


@pytest.mark.slow
@pytest.mark.needs_rpc
def test_serve_over_a_worker_answers_as_run_does_here(
    smollm2_target: Path, smollm2_draft: Path
) -> None:
    import openai

    from tests.test_server import start

    here = run_json(smollm2_target, smollm2_draft, "-k", "4")
    with worker() as (endpoint, _):
        proc, url = start(smollm2_target, smollm2_draft, "--rpc", endpoint, "-k", "4")
        try:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
            answer = client.completions.create(
                model="x", prompt="The capital of France is", temperature=0, max_tokens=24
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    assert answer.choices[0].text == here["text"]
    assert answer.usage.completion_tokens == 24


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
