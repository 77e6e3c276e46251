"""Hybrid targets and MTP heads as a user meets them: ``specgen run``, batches, the Python API
and the server, on the tiny qwen35 GGUFs of ``tests.tiny_models``; and every llama.cpp abort
path turned into one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.invoke import (
    TINY_FLAGS,
    batch_of_two,
    complete_in_process,
    fails_tiny,
    one_line_error,
    run_tiny,
    specgen_here,
    specgen_process,
)
from tests.tiny_models import Qwen35Shape, write_qwen35

FLAGS = TINY_FLAGS
run, fails = run_tiny, fails_tiny


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("qwen35-cli")
    return {
        "hybrid": write_qwen35(folder / "hybrid.gguf"),
        "draft": write_qwen35(folder / "hybrid-draft.gguf", seed=1),
        "mtp": write_qwen35(folder / "hybrid-mtp.gguf", mtp=True),
        "all-attention": write_qwen35(folder / "all-attention.gguf", Qwen35Shape(interval=1)),
        "no-attention": write_qwen35(folder / "no-attention.gguf", Qwen35Shape(n_trunk=1)),
        "two-heads": write_qwen35(folder / "two-heads.gguf", Qwen35Shape(nextn_layers=2), mtp=True),
    }


def test_a_target_with_an_mtp_head_drafts_with_it_by_default(files: dict[str, Path]) -> None:
    alone = run("--target", str(files["mtp"]), "-k", "0")
    by_default = run("--target", str(files["mtp"]), "-k", "2")
    assert by_default["mtp"] and by_default["stats"]["drafters"]["mtp"]["drafted"] > 0
    assert by_default["text"] == alone["text"]
    assert by_default["rollback"]["target"]["snapshots"] == 2
    off = run("--target", str(files["mtp"]), "-k", "2", "--no-mtp", "--no-ngram")
    assert not off["mtp"] and off["stats"]["drafters"] == {} and off["text"] == alone["text"]
    asked = run("--target", str(files["mtp"]), "--draft", "mtp", "--ngram", "-k", "auto")
    assert asked["mtp"] and asked["ngram"] and asked["text"] == alone["text"]


def test_hybrid_target_with_hybrid_draft_and_ngrams(files: dict[str, Path]) -> None:
    alone = run("--target", str(files["hybrid"]), "-k", "0")
    both = run("--target", str(files["hybrid"]), "--draft", str(files["draft"]), "-k", "4")
    assert both["text"] == alone["text"] and both["stats"]["drafters"]["model"]["drafted"] > 0
    facts = both["rollback"]
    assert facts["target"]["bounded"] > 0 and facts["target"]["snapshots"] == 4
    assert facts["target"]["snapshot_bytes"] == 5 * facts["target"]["state_bytes"] > 0
    assert facts["draft"]["checkpoint"] > 0  # a draft's rollbacks span decodes
    ngram = run("--target", str(files["hybrid"]), "--draft", "ngram", "-k", "12")
    assert ngram["text"] == alone["text"]


def test_batches_the_api_and_the_server_draft_with_the_head(
    files: dict[str, Path], tmp_path: Path
) -> None:
    from specgen.api import Specgen
    from specgen.server import create_app

    batch_of_two(tmp_path, "--target", str(files["mtp"]), *FLAGS[:-1])

    generator = Specgen(target=files["mtp"], threads=1, lookahead=2)
    assert generator.pair.mtp
    expected = generator.generate("hello world", max_tokens=16, temperature=0).text
    app = create_app(generator, api_key=None, max_queue=0)

    answer = complete_in_process(app, {"prompt": "hello world", "max_tokens": 16, "temperature": 0})
    assert answer["choices"][0]["text"] == expected


def test_mtp_asked_of_a_target_without_a_head_is_one_line(files: dict[str, Path]) -> None:
    line = fails("--target", str(files["hybrid"]), "--draft", "mtp")
    assert "has no MTP layers" in line and "--draft" in line


def test_opposite_mtp_options_are_a_usage_error(files: dict[str, Path]) -> None:
    done = specgen_here("run", "--target", str(files["mtp"]), "--draft", "mtp", "--no-mtp", "x")
    assert done.returncode == 2 and "opposite" in done.stderr


def test_a_qwen35_head_of_two_blocks_is_refused_before_llama_cpp_aborts(
    files: dict[str, Path],
) -> None:
    line = fails("--target", str(files["two-heads"]), "-k", "2")
    assert "exactly one MTP block" in line and "--no-mtp" in line


def test_a_build_without_the_staging_functions_is_one_line(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_cpp_ext", None)  # import fails
    line = fails("--target", str(files["mtp"]), "-k", "2")
    assert "lacks llama.cpp's MTP functions" in line and "--no-mtp" in line


def test_an_mtp_context_on_a_model_loaded_without_its_layers_is_refused(
    files: dict[str, Path],
) -> None:
    from specgen.backend import LlamaModel, ModelOptions, attach_mtp
    from specgen.errors import BackendError

    model = LlamaModel(files["mtp"], ModelOptions(n_ctx=128, n_threads=1, mtp=False))
    with pytest.raises(BackendError, match="loaded without MTP layers"):
        attach_mtp(model)


@pytest.mark.parametrize(
    ("name", "said"),
    [("all-attention", "no recurrent (DeltaNet) layer"), ("no-attention", "no attention layer")],
)
def test_a_qwen35_without_one_kind_of_layer_ends_as_one_line_not_an_abort(
    files: dict[str, Path], tmp_path: Path, name: str, said: str
) -> None:
    """llama.cpp aborts (SIGABRT, a core file) on its first decode of such a file: a new
    process shows that specgen refuses it first, with exit 1 and nothing left behind."""
    done = specgen_process("run", "--target", str(files[name]), "x", cwd=tmp_path, timeout=120)
    one_line_error(done, said)
    assert not list(tmp_path.glob("core*"))


def test_a_gemma4_assistant_draft_is_one_line(files: dict[str, Path], tmp_path: Path) -> None:
    """Gemma 4's assistant drafter shares the target's KV cache, which llama-cpp-python cannot
    set up yet: refused from its header, before llama.cpp loads it."""
    import gguf

    path = tmp_path / "mtp-gemma-4-E2B-it.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma4-assistant")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    line = fails("--target", str(files["hybrid"]), "--draft", str(path))
    assert "shares the target's cache" in line and "--draft ngram" in line


def test_bench_rows_draft_with_the_head(files: dict[str, Path], tmp_path: Path) -> None:
    """bench on a target with an MTP head: K rows, auto and hybrid draft with the head, and the
    command it recommends names it."""
    report = tmp_path / "bench.json"
    done = specgen_here(
        "bench", "--target", str(files["mtp"]), "-k", "1,2,auto,hybrid", "-n", "8",
        "--temperature", "0", "--threads", "1", "--json", str(report),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # the tiny vocabulary has no end of generation: the json prompt is left out, said once
    assert "the constrained prompts are left out" in done.stderr
    found = json.loads(report.read_text())
    assert found["meta"]["params"]["constrained_prompts"] == 0
    assert found["meta"]["draft"]["spec"] == "mtp"
    assert {row["lookahead"] for row in found["per_k"]} == {1, 2, "auto", "hybrid"}
    drafted = [row for row in found["per_k"] if row["lookahead"] in (1, 2)]
    assert all(row["draft_ms_per_token"] for row in drafted)  # the head made guesses


def test_a_batch_with_parallel_streams_drafts_from_the_mtp_head(
    files: dict[str, Path], tmp_path: Path
) -> None:
    """``run -f --parallel 2`` on a target with an MTP head: a head a sequence, and each text is
    the one the target alone gives."""
    from specgen.api import Specgen

    target = ["--target", str(files["mtp"])]
    alone = batch_of_two(tmp_path, *target, "-k", "0", *FLAGS[:-1])
    both = batch_of_two(tmp_path, *target, "-k", "auto", "--parallel", "2", *FLAGS[:-1])
    assert [r["text"] for r in both] == [r["text"] for r in alone]
    many = Specgen(target=files["mtp"], threads=1, lookahead=2, parallel=2)
    assert many.pair.mtp and len(many.pair.heads) == 2
    results = many.generate_many(["hello world", "second prompt"], max_tokens=16, temperature=0)
    single = Specgen(target=files["mtp"], threads=1, lookahead=0)
    for prompt, result in zip(["hello world", "second prompt"], results, strict=True):
        assert result.text == single.generate(prompt, max_tokens=16, temperature=0).text
        assert result.stats.by_source["mtp"].drafted > 0
