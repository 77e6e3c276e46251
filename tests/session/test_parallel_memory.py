"""The memory check before ``--parallel N`` loads: N contexts of each model must fit beside the
weights in the memory free, or one line says what they need."""

from __future__ import annotations

from pathlib import Path

import pytest

from specgen.errors import EXIT_FAILED, UserError
from specgen.host import machine
from specgen.models import arch, gguf
from specgen.session.fit import check_parallel_memory
from tests.invoke import one_line_error, specgen_here
from tests.tiny_models import write_header

# SmolLM2 135M's shape: 30 layers, 9 heads of 64, 3 of them for keys and values.
SMOL = {
    "llama.block_count": 30,
    "llama.embedding_length": 576,
    "llama.attention.head_count": 9,
    "llama.attention.head_count_kv": 3,
    "llama.context_length": 8192,
}
PER_TOKEN = 30 * 3 * (64 + 64) * 2  # bytes: layers x kv heads x (key + value) x F16


@pytest.fixture
def smol_shaped(tmp_path: Path) -> tuple[Path, Path]:
    tokens = [f"t{i}" for i in range(32)]
    target = write_header(tmp_path / "target.gguf", "llama", tokens, metadata=SMOL)
    draft = write_header(tmp_path / "draft.gguf", "llama", tokens, metadata=SMOL)
    return target, draft


def test_the_cache_per_token_is_read_from_the_header(smol_shaped: tuple[Path, Path]) -> None:
    header = gguf.read_local(str(smol_shaped[0]))
    assert arch.kv_bytes_per_token(header) == PER_TOKEN


def test_contexts_that_do_not_fit_are_refused_before_loading(
    smol_shaped: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    models = [(p, gguf.read_local(str(p), tensors=True)) for p in smol_shaped]
    need = 2 * 4 * 4096 * PER_TOKEN  # two models, four contexts of the default 4096 tokens
    monkeypatch.setattr(machine, "available_memory", lambda: need // 2)
    with pytest.raises(UserError, match=r"--parallel 4 needs about 0\.7 GiB .* 4 contexts of 4096"):
        check_parallel_memory(models, 0, 4)
    check_parallel_memory(models, 1024, 4)  # a quarter of the context fits
    check_parallel_memory(models, 0, 1)  # one sequence is never refused here
    monkeypatch.setattr(machine, "available_memory", lambda: 2 * need)
    check_parallel_memory(models, 0, 4)


def test_run_parallel_says_so_in_one_line(
    smol_shaped: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(machine, "available_memory", lambda: 10 * 2**20)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    target, draft = smol_shaped
    done = specgen_here(
        "run", "-f", str(prompts), "--target", str(target), "--draft", str(draft),
        "--parallel", "8",
    )  # fmt: skip
    one_line_error(done, "--parallel 8 needs about", "lower --parallel or --ctx-size",
                   code=EXIT_FAILED)  # fmt: skip
