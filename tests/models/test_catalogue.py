"""The 2026 catalogue and what specgen knows of the new families before any weights load: the
vocabulary rules on headers the ``gguf`` package writes here, MoE targets, and what ``models
info`` / ``models check`` / ``models list`` say of a hybrid or MTP model (``doctor``:
tests/test_checks.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specgen.models.registry import Registry
from tests.invoke import one_line_error, specgen_here
from tests.tiny_models import write_header, write_qwen35

NEW_PAIRS = {
    "qwen3.6-27b-mtp": ("unsloth/Qwen3.6-27B-MTP-GGUF", None),
    "qwen3.6-27b": ("unsloth/Qwen3.6-27B-GGUF", "ggml-org/Qwen3.5-0.8B-GGUF"),
    "gemma4-31b": ("ggml-org/gemma-4-31B-it-GGUF", "ggml-org/gemma-4-E2B-it-GGUF"),
    "qwen3-32b": ("Qwen/Qwen3-32B-GGUF", "Qwen/Qwen3-1.7B-GGUF"),
    "qwen3-14b": ("Qwen/Qwen3-14B-GGUF", "Qwen/Qwen3-0.6B-GGUF"),
    "qwen2.5-coder-14b": (
        "ggml-org/Qwen2.5-Coder-14B-Q8_0-GGUF",
        "ggml-org/Qwen2.5-Coder-0.5B-Q8_0-GGUF",
    ),
    "llama3.3-70b": (
        "bartowski/Llama-3.3-70B-Instruct-GGUF",
        "bartowski/Llama-3.2-1B-Instruct-GGUF",
    ),
}
OLD_PAIRS = ["qwen2.5-7b", "qwen3-8b", "llama3.1-8b", "gemma3-12b", "smollm2-135m-demo"]


def test_the_catalogue_has_the_2026_pairs_and_keeps_the_old_ones() -> None:
    registry = Registry.load()
    for name, (target, draft) in NEW_PAIRS.items():
        pair = registry.pairs[name]
        assert pair.target.repo == target
        assert (pair.draft.repo if pair.draft else None) == draft
    assert registry.pairs["qwen3.6-27b-mtp"].mtp
    # The same file name has other bytes in the repo without the MTP block: pinned.
    mtp_target = registry.pairs["qwen3.6-27b-mtp"].target
    assert mtp_target.sha256 and mtp_target.revision
    assert registry.pairs["qwen3.6-27b"].target.sha256 != mtp_target.sha256
    assert registry.pairs["gemma4-31b"].target.revision  # early uploads disagreed on BOS
    for name in OLD_PAIRS:
        assert name in registry.pairs
    # MoE targets with few active parameters are not draft-model pairs.
    for pair in registry.pairs.values():
        assert "A3B" not in (pair.target.file or "") and "gpt-oss" not in (pair.target.file or "")


def test_an_mtp_pair_resolves_to_its_hub_spec_and_drafts_with_the_head() -> None:
    from specgen.session.decide import decide

    decision = decide("qwen3.6-27b-mtp")
    assert decision.mtp and decision.draft is None and decision.lookahead == "auto"
    assert decision.choice.target.label().startswith("unsloth/Qwen3.6-27B-MTP-GGUF")
    off = decide("qwen3.6-27b-mtp", mtp=False)
    assert not off.mtp and off.ngram  # prompt lookup alone, as the pair allows


def tokens(n: int, changed_from: int | None = None) -> list[str]:
    return [f"t{i}" if changed_from is None or i < changed_from else f"x{i}" for i in range(n)]


@pytest.mark.parametrize(
    ("target", "draft", "said"),
    [
        (  # Gemma 3 drafts (SentencePiece) for Gemma 4 (BPE)
            dict(arch="gemma4", tokens=tokens(300), tokenizer="gemma4"),
            dict(arch="gemma3", tokens=tokens(300), tokenizer="llama"),
            ["vocabulary types differ", "Gemma 4 E2B"],
        ),
        (  # Qwen3 (151936) for Qwen3.5/3.6 (248320)
            dict(arch="qwen35", tokens=tokens(248320)),
            dict(arch="qwen3", tokens=tokens(151936)),
            ["sizes differ", "Qwen3.5-0.8B", "--draft mtp"],
        ),
        (  # Qwen2.5 and Qwen3: one size, other text from id 151665
            dict(arch="qwen3", tokens=tokens(151936)),
            dict(arch="qwen2", tokens=tokens(151936, changed_from=151665)),
            ["token 151665 differs", "Qwen3-0.6B"],
        ),
        (  # Gemma 4's early uploads: add_bos_token false on the 31B, true on E2B
            dict(arch="gemma4", tokens=tokens(300), tokenizer="gemma4", add_bos=False),
            dict(arch="gemma4", tokens=tokens(300), tokenizer="gemma4", add_bos=True),
            ["adds BOS", "early April 2026"],
        ),
    ],
)
def test_the_vocabulary_rules_know_the_new_families(
    tmp_path: Path, target: dict, draft: dict, said: list[str]
) -> None:
    t = write_header(tmp_path / "target.gguf", **target)
    d = write_header(tmp_path / "draft.gguf", **draft)
    checked = one_line_error(specgen_here("models", "check", "--target", str(t), "--draft", str(d)))
    ran = one_line_error(specgen_here("run", "--target", str(t), "--draft", str(d), "hi"))
    for line in (checked, ran):  # the run, before any weights load
        assert all(words in line for words in said), line


def test_models_check_says_a_few_active_experts_target_gains_nothing(tmp_path: Path) -> None:
    moe = write_header(
        tmp_path / "moe.gguf",
        "qwen35moe",
        tokens(300),
        metadata={"qwen35moe.expert_count": 256, "qwen35moe.expert_used_count": 8},
    )
    draft = write_header(tmp_path / "draft.gguf", "qwen35", tokens(300))
    done = specgen_here("models", "check", "--target", str(moe), "--draft", str(draft))
    assert done.returncode == 0, done.stderr
    assert "8 of 256 experts" in done.stderr and "rarely pays" in done.stderr


def test_models_info_and_check_say_what_a_hybrid_mtp_model_is(tmp_path: Path) -> None:
    target = write_qwen35(tmp_path / "mtp.gguf", mtp=True)
    info = json.loads(specgen_here("models", "info", str(target), "--json").stdout)
    assert (info["kind"], info["recurrent_layers"], info["attention_layers"]) == ("hybrid", 1, 1)
    assert info["mtp_heads"] == 1 and "snapshots up to K=4" in info["rollback"]
    # One DeltaNet layer of the tiny shape: conv (4-1) x 768 plus a 128 x 128 state per head.
    assert info["state_bytes"] == (3 * 768 + 128 * 128 * 2) * 4
    assert info["snapshot_bytes"] == 5 * info["state_bytes"]
    done = specgen_here("models", "check", "--target", str(target), "--draft", "mtp")
    assert done.returncode == 0 and "drafts with its own MTP head" in done.stdout


def test_models_list_tells_pairs_apart_at_80_columns() -> None:
    done = specgen_here("models", "list", env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in done.stdout
    rows = {line.split()[0]: line for line in lines[1:]}
    assert "27B Q4_K_M" in rows["qwen3.6-27b-mtp"] and "MTP head" in rows["qwen3.6-27b-mtp"]
    assert "0.8B Q8_0" in rows["qwen3.6-27b"] and "E2B Q8_0" in rows["gemma4-31b"]
    assert "135M Q4_1>F32" in rows["smollm2-135m-demo"]
