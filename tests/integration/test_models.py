"""The vocabulary check and ``models check`` on the real demo pairs' GGUFs (the rules on headers
written here are in tests/models/)."""

from __future__ import annotations

from pathlib import Path

from specgen.models import compat
from tests.conftest import with_models_cache
from tests.invoke import one_line_error, specgen_process


def test_real_pairs(
    smollm2_target: Path, smollm2_draft: Path, gemma_target: Path, gemma_draft: Path
) -> None:
    from specgen.backend import Vocabulary

    smol_t, smol_d = Vocabulary(smollm2_target), Vocabulary(smollm2_draft)
    gem_t, gem_d = Vocabulary(gemma_target), Vocabulary(gemma_draft)
    assert compat.check(smol_t, smol_d) and compat.check(gem_t, gem_d)
    verdict = compat.check(gem_t, smol_d)
    assert not verdict and "vocabulary types differ" in verdict.reason


def test_models_check_command(smollm2_draft: Path, gemma_target: Path) -> None:
    ok = specgen_process("models", "check", "smollm2-135m-demo", env=with_models_cache())
    assert ok.returncode == 0 and ok.stdout.startswith("ok smollm2-135m-demo: draft")
    assert "fits" in ok.stdout
    bad = specgen_process(
        "models", "check", "--target", str(gemma_target), "--draft", str(smollm2_draft)
    )
    one_line_error(bad, "cannot serve")
    ran = specgen_process(
        "run", "hi", "-n", "4", "--target", str(gemma_target), "--draft", str(smollm2_draft)
    )
    one_line_error(ran, "cannot serve")
