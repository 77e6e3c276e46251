"""The error table and exit codes: every mistake a user can make ends as one line that says
what to do next, with the documented exit code, no traceback, and nothing damaged."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from specgen.errors import (
    EXIT_FAILED,
    EXIT_USAGE,
    BackendError,
    CpuUnsupported,
    UsageError,
    UserError,
    describe,
    lookup,
)
from tests.conftest import FakePair
from tests.invoke import one_line_error, specgen_here, specgen_process
from tests.tiny_models import write_qwen35

specgen = specgen_here


def unwritable(tmp_path: Path, kind: str) -> Path:
    """A folder that cannot be created in, or a file that cannot be appended to (root ignores
    file modes, so it gets kernel files that refuse writes)."""
    if os.geteuid() == 0:
        return Path("/sys/specgen-read-only") if kind == "dir" else Path("/sys/kernel/notes")
    path = tmp_path / f"read-only-{kind}"
    if kind == "dir":
        path.mkdir()
        path.chmod(0o500)
        return path / "cache"
    path.write_text("")
    path.chmod(0o400)
    return path


def test_the_table_gives_each_error_its_exit_code_and_http_status() -> None:
    assert lookup(UsageError("x")).exit_code == EXIT_USAGE
    assert lookup(UserError("x")).exit_code == EXIT_FAILED
    assert lookup(CpuUnsupported("x")).http_status == 500
    assert lookup(BackendError("x")).http_status == 500
    assert lookup(FileNotFoundError(errno.ENOENT, "gone", "a.gguf")).http_status == 404
    full = OSError(errno.ENOSPC, "No space left on device", "/cache/x.gguf")
    assert "disk is full" in describe(full) and "/cache/x.gguf" in describe(full)
    assert "permission denied" in describe(PermissionError(errno.EACCES, "denied", "/x"))
    assert lookup(KeyError("bug")) is None and describe(ValueError("bug")) is None


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-k", "65"], "--lookahead"),
        (["-k", "-1"], "--lookahead"),
        (["--temperature", "-0.5"], "--temperature"),
        (["--top-k", "-1"], "--top-k"),
        (["--top-p", "0"], "--top-p"),
        (["--top-p", "1.5"], "--top-p"),
        (["--min-p", "1"], "--min-p"),
        (["--min-p", "-0.1"], "--min-p"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--threads", "-2"], "--threads"),
        (["--ctx-size", "100"], "256"),
        (["--ctx-size", "-1"], "--ctx-size"),
        (["--seed", "-5"], "--seed"),
        (["--seed", "4294967296"], "--seed"),
        (["--draft-p-min", "1.5"], "--draft-p-min"),
    ],
)
def test_out_of_range_options_are_usage_errors_named_as_typed(args: list[str], needle: str) -> None:
    done = specgen("run", "hello", "--target", "x.gguf", *args)
    one_line_error(done, needle, code=EXIT_USAGE)
    assert "top_p" not in done.stderr and "min_p" not in done.stderr


def test_a_folder_given_as_a_model(tmp_path: Path) -> None:
    one_line_error(
        specgen("run", "hello", "--target", str(tmp_path)),
        "folder",
        str(tmp_path),
        code=EXIT_FAILED,
    )


def test_unknown_pair_suggests_the_closest_names() -> None:
    one_line_error(
        specgen("run", "hello", "--pair", "smollm2-demo"),
        "unknown pair",
        "smollm2-135m-demo",
        code=EXIT_USAGE,
    )


def test_a_pair_member_is_named_target_or_draft() -> None:
    one_line_error(
        specgen("run", "hello", "--target", "smollm2-135m-demo:foo"),
        "smollm2-135m-demo:target",
        "smollm2-135m-demo:draft",
        code=EXIT_USAGE,
    )


def test_draft_alone_names_the_rule_not_a_file_never_given(tmp_path: Path) -> None:
    text = one_line_error(
        specgen("run", "hello", "--draft", str(tmp_path / "d.gguf")),
        "--draft needs a target",
        code=EXIT_USAGE,
    )
    assert "F32" not in text  # the default pair's converted target is not mentioned


def test_whitespace_prompt_argument() -> None:
    one_line_error(specgen("run", "  \t ", "--target", "x.gguf"), "empty", code=EXIT_USAGE)


def test_no_prompt_at_all() -> None:
    one_line_error(specgen("run", "--target", "x.gguf", input=None), "no prompt", code=EXIT_USAGE)


def test_malformed_models_toml_names_the_file_and_line(isolated: Path) -> None:
    home = Path(os.environ["SPECGEN_HOME"])
    (home / "models.toml").write_text(
        '[pairs.mine]\ntarget = { path = "t.gguf" }\n'
        'draft = { path = "d.gguf" }\nlookahead = "fast"\n'
    )
    one_line_error(specgen("run", "hello"), "models.toml, line 1", "lookahead", code=EXIT_FAILED)
    (home / "models.toml").write_text("[pairs.mine\n")
    one_line_error(specgen("models", "list"), "models.toml", "line 1", code=EXIT_FAILED)


def test_batch_output_that_is_a_folder(tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\n")
    one_line_error(
        specgen(
            "run", "-f", str(prompts), "--each-line", "-o", str(tmp_path), "--target", "x.gguf"
        ),
        "is a folder",
        code=EXIT_USAGE,
    )


def test_batch_output_that_cannot_be_written(tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\n")
    target = unwritable(tmp_path, "file")
    before = target.read_bytes()
    one_line_error(
        specgen("run", "-f", str(prompts), "--each-line", "-o", str(target), "--target", "x.gguf"),
        "permission denied",
        str(target),
        code=EXIT_FAILED,
    )
    assert target.read_bytes() == before


def test_output_and_resume_belong_to_batches(tmp_path: Path) -> None:
    one_line_error(
        specgen("run", "hi", "-o", str(tmp_path / "o.jsonl"), "--target", "x.gguf"),
        "--output and --resume are for batches",
        code=EXIT_USAGE,
    )
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\n")
    one_line_error(
        specgen("run", "-f", str(prompts), "--each-line", "--resume", "--target", "x.gguf"),
        "--resume needs --output",
        code=EXIT_USAGE,
    )


def test_a_read_only_cache_folder_says_so(tmp_path: Path) -> None:
    done = specgen(
        "models",
        "pull",
        "smollm2-135m-demo",
        env={"SPECGEN_CACHE": str(unwritable(tmp_path, "dir"))},
    )
    one_line_error(done, "SPECGEN_CACHE", code=EXIT_FAILED, progress=True)  # after "fetching"


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    done = specgen_process(
        "run", "hello", "--target", str(tmp_path), env={"SPECGEN_DEBUG": "1"}, timeout=120
    )
    assert done.returncode == 1 and "Traceback" in done.stderr


def test_disk_full_while_converting_leaves_no_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import shutil

    from specgen import backend
    from specgen.models import fetch

    src = tmp_path / "model.gguf"
    src.write_bytes(b"GGUF" + b"\0" * 1000)

    def quantize(source: Path, dest: Path, quant: str, n_threads: int = 0) -> None:
        Path(dest).write_bytes(b"half a file")
        raise BackendError("llama.cpp could not convert (status 1)")

    monkeypatch.setattr(backend, "quantize", quantize)
    monkeypatch.setattr(
        shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 10, 10)
    )
    with pytest.raises(OSError) as caught:
        fetch.derive(src, "F32")
    assert caught.value.errno == errno.ENOSPC and "disk is full" in describe(caught.value)
    folder = fetch.derived_path(src, "F32").parent
    assert list(folder.iterdir()) == []  # neither a partial nor a complete-looking file


def test_a_bad_json_line_in_a_batch_names_its_line_before_loading(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "fine"}\n{oops\n')
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": 9, "text": "kept"}\n')
    done = specgen(
        "run", "-f", str(prompts), "-o", str(out), "--target", str(tmp_path / "missing.gguf")
    )
    one_line_error(done, "missing.gguf", code=EXIT_FAILED)
    assert json.loads(out.read_text().splitlines()[0]) == {"id": 9, "text": "kept"}


def test_a_truncated_gguf(tmp_path: Path) -> None:
    whole = write_qwen35(tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:2000])  # inside the header
    one_line_error(specgen("models", "info", str(cut)), "cut short", "cut.gguf", code=EXIT_FAILED)
    cut.write_bytes(whole[: len(whole) // 2])  # the header whole, the weights cut (llama.cpp's)
    one_line_error(
        specgen("run", "hello", "--target", str(cut)),
        "could not load",
        "cut.gguf",
        code=EXIT_FAILED,
    )


def test_a_prompt_longer_than_the_context_says_both_lengths(fake_pair: FakePair) -> None:
    done = specgen(
        "run", "word " * 60, "--target", str(fake_pair.target), "--ctx-size", "256", "--raw"
    )
    # one line: no (empty) statistics above it
    one_line_error(
        done,
        "the prompt (300 tokens)",  # a fake's token is a byte
        "(256 tokens)",
        "--ctx-size",
        code=EXIT_FAILED,
    )
    assert done.stdout == ""


def test_models_list_never_splits_a_name_at_80_columns() -> None:
    done = specgen("models", "list", env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    rows = lines[1:]
    from specgen.models.registry import Registry

    # one line per built-in pair: nothing wrapped onto a second line
    assert len(rows) == len(Registry.load().pairs)
    assert all(row.split()[-2] == "auto" for row in rows)  # the K column is whole
    verbose = specgen("models", "list", "-v", env={"COLUMNS": "80"})
    assert verbose.returncode == 0, verbose.stderr
    for pair in Registry.load().pairs.values():  # each spec whole on a line of its own
        for role, spec in pair.members():
            assert f"  {role:<7} {spec.label()}" in verbose.stdout.splitlines()


def test_system_advice_is_one_line_and_never_circular(fake_pair: FakePair, tmp_path: Path) -> None:
    """--system with --raw, and --system on a model with no chat template: each one line
    (no empty statistics first), and neither sends the user to the other's refusal."""
    from tests.fakes import write_fake

    raw = specgen("run", "Hi", *fake_pair.args("--system", "Be brief.", "--raw"))
    line = one_line_error(raw, "--system needs a chat", "drop --raw", code=EXIT_USAGE)
    assert "put the instructions in the prompt" in line
    bare = write_fake(tmp_path / "bare.gguf", chat_template=None)
    untemplated = specgen("run", "Hi", "--target", str(bare), "--system", "Be brief.")
    line = one_line_error(untemplated, "no chat template", "drop --system", code=EXIT_FAILED)
    assert "--raw" not in line


def test_a_drafter_name_specgen_does_not_know_names_those_it_does(fake_pair: FakePair) -> None:
    done = specgen("run", "Hi", "--target", str(fake_pair.target), "--draft", "eagle")
    one_line_error(done, "model file not found: eagle", "'ngram'", "'mtp'", code=EXIT_FAILED)
