"""models.toml, model specs, and the draft/target vocabulary check."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from specgen.errors import UserError
from specgen.models import compat
from specgen.models.registry import ModelSpec, Registry
from tests.invoke import REPO

REQUIRED = {
    "qwen2.5-7b": (
        "bartowski/Qwen2.5-7B-Instruct-GGUF",
        "Qwen2.5-7B-Instruct-Q4_K_M.gguf",
        "Qwen/Qwen2.5-0.5B-Instruct-GGUF",
        "qwen2.5-0.5b-instruct-q8_0.gguf",
    ),
    "qwen2.5-coder-7b": (
        "ggml-org/Qwen2.5-Coder-7B-Q8_0-GGUF",
        "qwen2.5-coder-7b-q8_0.gguf",
        "ggml-org/Qwen2.5-Coder-0.5B-Q8_0-GGUF",
        "qwen2.5-coder-0.5b-q8_0.gguf",
    ),
    "qwen3-8b": (
        "Qwen/Qwen3-8B-GGUF",
        "Qwen3-8B-Q4_K_M.gguf",
        "Qwen/Qwen3-0.6B-GGUF",
        "Qwen3-0.6B-Q8_0.gguf",
    ),
    "llama3.1-8b": (
        "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF",
        "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
        "bartowski/Llama-3.2-1B-Instruct-GGUF",
        "Llama-3.2-1B-Instruct-Q8_0.gguf",
    ),
    "gemma3-12b": (
        "unsloth/gemma-3-12b-it-GGUF",
        "gemma-3-12b-it-Q4_K_M.gguf",
        "ggml-org/gemma-3-1b-it-GGUF",
        "gemma-3-1b-it-Q8_0.gguf",
    ),
    "smollm2-1.7b": (
        "HuggingFaceTB/SmolLM2-1.7B-Instruct-GGUF",
        "smollm2-1.7b-instruct-q4_k_m.gguf",
        "HuggingFaceTB/SmolLM2-360M-Instruct-GGUF",
        "smollm2-360m-instruct-q8_0.gguf",
    ),
}


@pytest.fixture
def builtin(tmp_path: Path) -> Registry:
    return Registry.load(tmp_path / "none.toml")


def test_builtin_pairs_name_the_exact_hub_files(builtin: Registry) -> None:
    for name, (t_repo, t_file, d_repo, d_file) in REQUIRED.items():
        pair = builtin.pair(name)
        assert (pair.target.repo, pair.target.file) == (t_repo, t_file)
        assert (pair.draft.repo, pair.draft.file) == (d_repo, d_file)
        assert pair.description and pair.license
        assert pair.lookahead == "auto" and pair.ngram  # hybrid drafting, K chosen per cycle


def test_default_is_the_package_index_chat_pair(builtin: Registry) -> None:
    default = builtin.pair()
    assert default.name == "smollm2-135m-demo" and default.chat
    assert default.target.kind == default.draft.kind == "pip"
    assert default.target.quant == "F32" and "two precisions" in default.description
    gemma = builtin.pair("gemma3-270m-demo")
    assert not gemma.chat and gemma.target.quant == "F32" and len(gemma.target.pip) == 4


def test_unknown_pair_suggests_a_name(builtin: Registry) -> None:
    with pytest.raises(UserError, match="did you mean 'qwen3-8b'"):
        builtin.pair("qwen3-8")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("org/repo-GGUF:model.gguf", ModelSpec(repo="org/repo-GGUF", file="model.gguf")),
        (
            "org/repo-GGUF@v1:m*.gguf",
            ModelSpec(repo="org/repo-GGUF", file="m*.gguf", revision="v1"),
        ),
        ("./models/x.gguf", ModelSpec(path="./models/x.gguf")),
        ("/abs/x.gguf", ModelSpec(path="/abs/x.gguf")),
    ],
)
def test_command_line_specs(builtin: Registry, text: str, expected: ModelSpec) -> None:
    assert builtin.spec(text) == expected


def test_pair_member_spec(builtin: Registry) -> None:
    assert builtin.spec("qwen3-8b:draft") == builtin.pair("qwen3-8b").draft
    assert builtin.spec("qwen3-8b:target") == builtin.pair("qwen3-8b").target
    with pytest.raises(UserError, match="qwen3-8b:target or qwen3-8b:draft"):
        builtin.spec("qwen3-8b")


@pytest.mark.parametrize(
    "table, message",
    [
        ('target = { repo = "a/b" }\ndraft = { path = "x" }', "needs a 'file'"),
        (
            'target = { repo = "a/b", file = "f", path = "p" }\ndraft = { path = "x" }',
            "exactly one",
        ),
        ('target = { path = "p", sha256 = "abc" }\ndraft = { path = "x" }', "64 hex"),
        ('target = { path = "p", colour = "red" }\ndraft = { path = "x" }', "unknown key"),
        ('chat = "yes"\ntarget = { path = "p" }\ndraft = { path = "x" }', "'chat'"),
    ],
)
def test_bad_specs_are_explained(tmp_path: Path, table: str, message: str) -> None:
    user = tmp_path / "models.toml"
    user.write_text(f"\n[pairs.bad]\n{table}\n")
    with pytest.raises(UserError, match=message) as err:
        Registry.load(user)
    assert "line 2" in str(err.value)


def test_models_toml_ships_in_the_wheel(tmp_path: Path) -> None:
    """The built-in models.toml is package data: a built wheel carries it."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
    )
    import zipfile

    wheel = next(tmp_path.glob("specgen-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "specgen/models/models.toml" in names
    text = zipfile.ZipFile(wheel).read("specgen/models/models.toml").decode()
    assert text == (REPO / "models.toml").read_text()


# -- the vocabulary check ---------------------------------------------------------------------


@dataclass
class FakeVocab:
    n_vocab: int = 1000
    vocab_type: int = 2
    bos: int = 1
    eos: int = 2
    adds_bos: bool = True
    adds_eos: bool = False
    changed: dict[int, bytes] = field(default_factory=dict)

    def token_text(self, token: int) -> bytes:
        return self.changed.get(token, f"tok{token}".encode())


@pytest.mark.parametrize(
    "draft, reason",
    [
        (FakeVocab(vocab_type=1), "vocabulary types differ (target BPE, draft SPM)"),
        (FakeVocab(bos=7), "BOS ids differ (target 1, draft 7)"),
        (FakeVocab(adds_bos=False), "adds BOS"),
        (FakeVocab(n_vocab=1129), "sizes differ by 129"),
        (FakeVocab(changed={500: b"other"}), "token 500 differs: target 'tok500', draft 'other'"),
    ],
)
def test_incompatible_drafts_name_the_first_difference(draft: FakeVocab, reason: str) -> None:
    verdict = compat.check(FakeVocab(), draft)
    assert not verdict and reason in verdict.reason


def test_compatible_drafts() -> None:
    assert compat.check(FakeVocab(), FakeVocab())
    assert compat.check(FakeVocab(), FakeVocab(n_vocab=1128))  # Qwen2.5 0.5B vs 7B style
    assert compat.check(FakeVocab(), FakeVocab(changed={3: b"x"}))  # ids below 5 not compared
    assert compat.check(FakeVocab(adds_eos=False, eos=2), FakeVocab(eos=9))  # EOS not added


def test_a_pair_may_draft_by_ngrams_or_turn_hybrid_drafting_off(tmp_path: Path) -> None:
    from specgen.session.choice import choose

    user = tmp_path / "models.toml"
    user.write_text(
        '[pairs.lookup]\ntarget = { path = "/m/t.gguf" }\ndraft = "ngram"\nlookahead = "auto"\n'
        '[pairs.plain]\ntarget = { path = "/m/t.gguf" }\ndraft = { path = "/m/d.gguf" }\n'
        "ngram = false\n"
    )
    registry = Registry.load(user)
    lookup = registry.pair("lookup")
    assert lookup.draft is None and lookup.ngram and lookup.lookahead == "auto"
    assert [role for role, _ in lookup.members()] == ["target"]
    assert not registry.pair("plain").ngram
    assert choose(registry, "plain", None, None).ngram is False
    assert choose(registry, "plain", None, None, ngram=True).ngram is True
    by_flag = choose(registry, "plain", None, "ngram")
    assert by_flag.draft is None and by_flag.ngram
    assert choose(registry, "plain", None, "./ngram").draft.path == "./ngram"
    user.write_text(
        '[pairs.bad]\ntarget = { path = "/m/t.gguf" }\ndraft = "ngram"\nlookahead = "fast"\n'
    )
    with pytest.raises(UserError, match="line 1.*auto"):
        Registry.load(user)
