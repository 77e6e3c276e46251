"""EAGLE3 and DFlash heads as a user meets them: ``--draft eagle3:FILE`` (or the file alone),
``models.toml``, batches, the Python API, the server, bench rows and ``models info/check``, on
the tiny GGUFs of ``tests.tiny_models``; and every mismatch one line before weights load."""

from __future__ import annotations

import json
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
)
from tests.tiny_models import LlamaShape, write_dflash, write_eagle3, write_llama, write_qwen35

FLAGS = TINY_FLAGS
run, fails = run_tiny, fails_tiny


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("heads-cli")
    return {
        "target": write_llama(folder / "target.gguf"),
        "eagle3": write_eagle3(folder / "eagle3.gguf"),
        "dflash": write_dflash(folder / "dflash.gguf"),
        "far": write_eagle3(folder / "far.gguf", layers=(0, 1, 7)),
        "final": write_eagle3(folder / "final.gguf", layers=(0, 1, 4)),
        "wide": write_eagle3(folder / "wide.gguf", LlamaShape(n_embd=128)),
        "two": write_eagle3(folder / "two.gguf", layers=(0, 1)),
        "other-vocab": write_eagle3(folder / "other-vocab.gguf", LlamaShape(n_vocab=96)),
        "qwen35": write_qwen35(folder / "qwen35.gguf"),
    }


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_a_head_drafts_and_the_text_is_the_targets(files: dict[str, Path], kind: str) -> None:
    target = str(files["target"])
    alone = run("--target", target, "-k", "0")
    for spelling in (f"{kind}:{files[kind]}", str(files[kind])):  # the prefix, or the file
        for k in ("3", "auto"):
            got = run("--target", target, "--draft", spelling, "-k", k, "--no-ngram")
            assert got["text"] == alone["text"], (spelling, k)
            assert got["head"] == kind and got["draft"] is None and not got["mtp"]
            assert k == "auto" or got["stats"]["drafters"][kind]["drafted"] > 0
    hybrid = run("--target", target, "--draft", f"{kind}:{files[kind]}", "-k", "4", "--ngram")
    assert hybrid["text"] == alone["text"] and hybrid["ngram"]


def test_a_pair_in_models_toml_names_its_head(
    files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    pair = (
        f'[pairs.tiny]\ntarget = {{ path = "{files["target"]}" }}\n'
        f'draft = {{ head = "HEAD", path = "{files["dflash"]}" }}\nlookahead = 3\n'
    )
    (home / "models.toml").write_text(pair.replace("HEAD", "dflash"))
    monkeypatch.setenv("SPECGEN_HOME", str(home))
    alone = run("--target", str(files["target"]), "-k", "0")
    by_pair = run("--pair", "tiny", "--no-ngram")
    assert by_pair["head"] == "dflash" and by_pair["text"] == alone["text"]
    assert by_pair["stats"]["drafters"]["dflash"]["drafted"] > 0
    (home / "models.toml").write_text(pair.replace("HEAD", "medusa"))
    line = fails("--pair", "tiny")
    assert "'head' must be one of eagle3, dflash" in line


@pytest.mark.parametrize(
    ("draft", "said"),
    [
        ("dflash:{eagle3}", "is an EAGLE3 head, not a DFlash head: write eagle3:eagle3.gguf"),
        ("eagle3:{target}", "is a llama model, not an EAGLE3 head: drop the 'eagle3:'"),
        ("{far}", "reads target layers [0, 1, 7] and the target has 4"),
        ("{final}", "reads the target's final hidden state (layer 4), which specgen cannot"),
        ("{wide}", "reads hidden states 128 wide and the target's are 256"),
        ("{two}", "it reads 2 target layers, and an EAGLE3 head reads 3"),
        ("{other-vocab}", "its vocabulary has 96 tokens and the target's 128"),
    ],
)
def test_a_head_that_does_not_fit_is_one_line_before_it_loads(
    files: dict[str, Path], draft: str, said: str
) -> None:
    spelled = draft.format(**{name: str(path) for name, path in files.items()})
    line = fails("--target", str(files["target"]), "--draft", spelled, "-k", "2")
    assert said in line, line


def test_a_target_whose_layers_llama_cpp_cannot_hand_out_is_refused(
    files: dict[str, Path], tmp_path: Path
) -> None:
    """A gemma3 target's graph keeps no layer inputs: llama.cpp would abort on the first decode
    with the head on. Refused from the headers."""
    import gguf

    target = tmp_path / "gemma3.gguf"
    writer = gguf.GGUFWriter(str(target), "gemma3")
    writer.add_block_count(4)
    writer.add_embedding_length(256)
    writer.add_tokenizer_model("test")
    writer.add_token_list([f"tok_{i}" for i in range(128)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    line = fails("--target", str(target), "--draft", str(files["eagle3"]), "-k", "2")
    assert "gemma3 model, whose layers llama.cpp cannot hand to a head" in line


def test_dspark_and_dflash2_heads_are_named_and_refused(
    files: dict[str, Path], tmp_path: Path
) -> None:
    import gguf

    for variant, tensor in (("DSpark", "markov_w1.weight"), ("DFlash2", "selector_hidden.weight")):
        path = tmp_path / f"{variant}.gguf"
        writer = gguf.GGUFWriter(str(path), "dflash")
        writer.add_array("dflash.target_layers", [1, 3])
        writer.add_tensor(tensor, __import__("numpy").zeros(4, dtype="float32"))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        line = fails("--target", str(files["target"]), "--draft", str(path), "-k", "2")
        assert f"of the {variant} kind, which specgen cannot run yet" in line


def test_a_head_for_a_llama_cpp_fork_is_one_line(files: dict[str, Path], tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "dflash-draft-3.6-q8_0.gguf"
    writer = gguf.GGUFWriter(str(path), "dflash-draft")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    line = fails("--target", str(files["target"]), "--draft", str(path), "-k", "2")
    assert "for the buun-llama-cpp fork" in line and "convert_hf_to_gguf.py" in line


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_a_batch_with_parallel_streams_drafts_from_a_head_each(
    files: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    """``run -f --parallel 2`` and ``Specgen(parallel=2).generate_many``: every sequence drafts
    from a head of its own, and each text is the one the target alone gives."""
    from specgen.api import Specgen

    head = f"{kind}:{files[kind]}"
    target = ["--target", str(files["target"])]
    alone = batch_of_two(tmp_path, *target, "-k", "0", *FLAGS[:-1])
    both = batch_of_two(tmp_path, *target, "--draft", head, "--parallel", "2", *FLAGS[:-1])
    assert [r["text"] for r in both] == [r["text"] for r in alone]
    many = Specgen(target=files["target"], draft=head, threads=1, lookahead=3, parallel=2)
    assert len(many.pair.heads) == 2 and many.pair.heads[0] is not many.pair.heads[1]
    prompts = ["hello world", "second prompt", "a third one"]
    results = many.generate_many(prompts, max_tokens=16, temperature=0)
    single = Specgen(target=files["target"], threads=1, lookahead=0)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.text == single.generate(prompt, max_tokens=16, temperature=0).text
        assert result.stats.by_source[kind].drafted > 0


def test_batches_the_api_and_the_server_draft_with_the_head(
    files: dict[str, Path], tmp_path: Path
) -> None:
    from specgen.api import Specgen
    from specgen.server import create_app

    head = f"eagle3:{files['eagle3']}"
    batch_of_two(tmp_path, "--target", str(files["target"]), "--draft", head, *FLAGS[:-1])
    generator = Specgen(
        target=files["target"], draft=f"dflash:{files['dflash']}", threads=1, lookahead=3
    )
    assert generator.pair.head_kind == "dflash"
    alone = Specgen(target=files["target"], threads=1, lookahead=0)
    expected = alone.generate("hello world", max_tokens=16, temperature=0).text
    assert generator.generate("hello world", max_tokens=16, temperature=0).text == expected
    app = create_app(generator, api_key=None, max_queue=0)

    answer = complete_in_process(app, {"prompt": "hello world", "max_tokens": 16, "temperature": 0})
    assert answer["choices"][0]["text"] == expected


def test_bench_rows_draft_with_the_head(files: dict[str, Path], tmp_path: Path) -> None:
    report = tmp_path / "bench.json"
    done = specgen_here(
        "bench", "--target", str(files["target"]), "--draft", f"dflash:{files['dflash']}",
        "-k", "2,auto", "-n", "8", "--temperature", "0", "--threads", "1", "--json", str(report),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = json.loads(report.read_text())
    assert found["meta"]["draft"]["spec"] == f"dflash:{files['dflash']}"
    assert {row["lookahead"] for row in found["per_k"]} == {2, "auto"}
    assert next(r for r in found["per_k"] if r["lookahead"] == 2)["draft_ms_per_token"]


def test_models_info_and_check_say_what_a_head_is(files: dict[str, Path]) -> None:
    info = specgen_here("models", "info", str(files["dflash"]), "--json")
    assert info.returncode == 0, info.stderr
    facts = json.loads(info.stdout)
    assert facts["head"] == "a DFlash head reading target layers [1, 3], 7 guesses a pass"
    assert facts["head_layers"] == [1, 3] and facts["head_block_size"] == 8
    check = specgen_here(
        "models", "check", "--target", str(files["target"]), "--draft", f"eagle3:{files['eagle3']}"
    )
    assert check.returncode == 0, check.stderr
    assert "is an EAGLE3 head reading target layers [0, 1, 3] of target.gguf" in check.stdout
    far = specgen_here(
        "models", "check", "--target", str(files["target"]), "--draft", str(files["far"])
    )
    one_line_error(far, "reads target layers [0, 1, 7] and the target has 4", code=1)


def test_a_build_without_the_head_functions_is_one_line(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A llama.cpp whose library does not export the staging functions under the names bound
    (another compiler's mangling, an older build): one line, before anything drafts."""
    from specgen.backend import heads

    missing = dict(heads._MANGLED)
    plain, _, argtypes, restype = missing["get_layer_inp"]
    msvc = "?llama_get_embeddings_layer_inp@@YAPEAMPEAUllama_context@@I@Z"
    missing["get_layer_inp"] = (plain, msvc, argtypes, restype)
    monkeypatch.setattr(heads, "_MANGLED", missing)
    monkeypatch.setattr(heads, "_bindings", None)
    assert not heads.supports_heads()
    line = fails("--target", str(files["target"]), "--draft", str(files["eagle3"]), "-k", "2")
    assert "lacks llama_get_embeddings_layer_inp, which EAGLE3 and DFlash heads need" in line
    assert "draft model" in line
