"""``benchmarks/concurrency.py``: which llama.cpp each side of a table ran; what a workload
sends and how it counts the answers' tokens."""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

from specgen.backend import system_info
from specgen.checks import cpu_features
from tests.bench import benchmark


@pytest.fixture(scope="module")
def concurrency() -> ModuleType:
    return benchmark("concurrency")


def test_the_features_a_build_has_are_those_set_to_one() -> None:
    info = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 0 | FMA = 1 | OPENMP = 1 | \n"
    assert cpu_features("Metal : EMBED_LIBRARY = 1 | \n" + info) == [
        "AVX",
        "AVX2",
        "EMBED_LIBRARY",
        "FMA",
        "OPENMP",
        "SSE3",
    ]
    assert cpu_features("nothing set") == []


def test_this_builds_features_are_read_from_its_own_llama_cpp(concurrency: ModuleType) -> None:
    """A child process of this interpreter reports its llama.cpp's features as doctor does."""
    found = concurrency.specgen_build()
    assert found != "unknown" and found.split()
    assert found == " ".join(cpu_features(system_info()))


def test_llama_servers_build_is_read_from_its_cmake_cache(
    concurrency: ModuleType, tmp_path: Path
) -> None:
    """The binary sits in build/bin; the cache one folder up says how it was configured."""
    (tmp_path / "bin").mkdir()
    server = tmp_path / "bin" / "llama-server"
    server.write_text("")
    assert concurrency.llama_build(str(server)) is None  # no cache: not known
    (tmp_path / "CMakeCache.txt").write_text(
        "GGML_NATIVE:BOOL=OFF\nGGML_AVX:BOOL=ON\nGGML_AVX2:BOOL=ON\nGGML_AVX512:BOOL=OFF\n"
        "GGML_FMA:BOOL=ON\nGGML_F16C:BOOL=ON\nGGML_OPENMP:BOOL=ON\nLLAMA_CURL:BOOL=OFF\n"
    )
    assert concurrency.llama_build(str(server)) == "not native; AVX AVX2 F16C FMA"
    (tmp_path / "CMakeCache.txt").write_text("GGML_NATIVE:BOOL=ON\n")
    assert concurrency.llama_build(str(server)) == "native; -"


class CountingEog(BaseHTTPRequestHandler):
    """Answers as llama-server does: an answer ended by its end-of-generation token counts that
    token in ``completion_tokens``. Request i writes 3 + i tokens of text; the even ones end on
    their end-of-generation token, the odd ones at ``max_tokens``. Keeps the bodies it got."""

    bodies: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        sent = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(sent)
        i = sent["seed"] % 1000
        ended = i % 2 == 0
        usage = {"completion_tokens": 3 + i + int(ended), "prompt_tokens": 5}
        reply = {"choices": [{"text": "x", "finish_reason": "stop" if ended else "length"}]}
        data = json.dumps({**reply, "usage": usage}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def eog_server() -> Iterator[str]:
    CountingEog.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), CountingEog)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_workload_counts_the_texts_tokens_whichever_server_counts_the_end(
    concurrency: ModuleType, eog_server: str
) -> None:
    """llama-server's end-of-generation token is left out of its count (specgen counts none):
    four answers of 3, 4, 5 and 6 tokens of text are 18 tokens from either; an answer cut at
    ``max_tokens`` keeps its count."""
    args = argparse.Namespace(requests=4, max_tokens=16, temperature=0.8)
    as_counted = concurrency.workload(eog_server, 2, args)
    assert as_counted["request_tokens"] == [4, 4, 6, 6]
    texts = concurrency.workload(eog_server, 2, args, eog_counted=True)
    assert texts["request_tokens"] == [3, 4, 5, 6]
    assert texts["completion_tokens"] == 18 and "error" not in texts


def test_a_rounds_seeds_are_new_and_each_request_keeps_its_own(
    concurrency: ModuleType, eog_server: str
) -> None:
    """Sampled requests carry the seed ``seeds + i``; greedy ones none."""
    args = argparse.Namespace(requests=3, max_tokens=16, temperature=0.8)
    concurrency.workload(eog_server, 1, args, seeds=2000)
    assert [b["seed"] for b in CountingEog.bodies] == [2000, 2001, 2002]
    assert {b["top_k"] for b in CountingEog.bodies} == {40}
    assert "seed" not in concurrency.body(0, argparse.Namespace(max_tokens=8, temperature=0.0))
