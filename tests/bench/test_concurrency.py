"""``benchmarks/concurrency.py``'s build lines: which llama.cpp each side of a table ran."""

from __future__ import annotations

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
