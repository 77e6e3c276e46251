"""The error table and exit codes: every mistake a user can make ends as one line that says
what to do next, with the documented exit code, no traceback, and nothing damaged."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
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
from tests.invoke import Done, specgen_here

SPECGEN = [sys.executable, "-m", "specgen"]


specgen = specgen_here


def one_line(done: Done | subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """The single error line of a failed command (Typer's usage errors are framed by Typer)."""
    assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert done.stdout == ""
    text = " ".join(done.stderr.split())
    for needle in needles:
        assert needle in text, done.stderr
    return text


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
    one_line(done, EXIT_USAGE, needle)
    assert "top_p" not in done.stderr and "min_p" not in done.stderr


def test_a_folder_given_as_a_model(tmp_path: Path) -> None:
    one_line(
        specgen("run", "hello", "--target", str(tmp_path)), EXIT_FAILED, "folder", str(tmp_path)
    )


def test_unknown_pair_suggests_the_closest_names() -> None:
    one_line(
        specgen("run", "hello", "--pair", "smollm2-demo"),
        EXIT_USAGE,
        "unknown pair",
        "smollm2-135m-demo",
    )


def test_a_pair_member_is_named_target_or_draft() -> None:
    one_line(
        specgen("run", "hello", "--target", "smollm2-135m-demo:foo"),
        EXIT_USAGE,
        "smollm2-135m-demo:target",
        "smollm2-135m-demo:draft",
    )


def test_draft_alone_names_the_rule_not_a_file_never_given(tmp_path: Path) -> None:
    text = one_line(
        specgen("run", "hello", "--draft", str(tmp_path / "d.gguf")),
        EXIT_USAGE,
        "--draft needs a target",
    )
    assert "F32" not in text  # the default pair's converted target is not mentioned


def test_whitespace_prompt_argument() -> None:
    one_line(specgen("run", "  \t ", "--target", "x.gguf"), EXIT_USAGE, "empty")


def test_no_prompt_at_all() -> None:
    one_line(specgen("run", "--target", "x.gguf", input=None), EXIT_USAGE, "no prompt")


def test_malformed_models_toml_names_the_file_and_line(isolated: Path) -> None:
    home = Path(os.environ["SPECGEN_HOME"])
    (home / "models.toml").write_text(
        '[pairs.mine]\ntarget = { path = "t.gguf" }\n'
        'draft = { path = "d.gguf" }\nlookahead = "fast"\n'
    )
    one_line(specgen("run", "hello"), EXIT_FAILED, "models.toml, line 1", "lookahead")
    (home / "models.toml").write_text("[pairs.mine\n")
    one_line(specgen("models", "list"), EXIT_FAILED, "models.toml", "line 1")


def test_batch_output_that_is_a_folder(tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\n")
    one_line(
        specgen(
            "run", "-f", str(prompts), "--each-line", "-o", str(tmp_path), "--target", "x.gguf"
        ),
        EXIT_USAGE,
        "is a folder",
    )


def test_batch_output_that_cannot_be_written(tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\n")
    target = unwritable(tmp_path, "file")
    before = target.read_bytes()
    one_line(
        specgen("run", "-f", str(prompts), "--each-line", "-o", str(target), "--target", "x.gguf"),
        EXIT_FAILED,
        "permission denied",
        str(target),
    )
    assert target.read_bytes() == before


def test_output_and_resume_belong_to_batches(tmp_path: Path) -> None:
    one_line(
        specgen("run", "hi", "-o", str(tmp_path / "o.jsonl"), "--target", "x.gguf"),
        EXIT_USAGE,
        "--output and --resume are for batches",
    )
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\n")
    one_line(
        specgen("run", "-f", str(prompts), "--each-line", "--resume", "--target", "x.gguf"),
        EXIT_USAGE,
        "--resume needs --output",
    )


def test_a_read_only_cache_folder_says_so(tmp_path: Path) -> None:
    done = specgen(
        "models",
        "pull",
        "smollm2-135m-demo",
        env={"SPECGEN_CACHE": str(unwritable(tmp_path, "dir"))},
    )
    one_line(done, EXIT_FAILED, "SPECGEN_CACHE")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    done = subprocess.run(
        [*SPECGEN, "run", "hello", "--target", str(tmp_path)],
        text=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, "SPECGEN_DEBUG": "1"},
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
    one_line(done, EXIT_FAILED, "missing.gguf")
    assert json.loads(out.read_text().splitlines()[0]) == {"id": 9, "text": "kept"}


@pytest.mark.slow
def test_a_truncated_gguf(smollm2_draft: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with smollm2_draft.open("rb") as whole:
        cut.write_bytes(whole.read(1_000_000))  # inside the header
    one_line(specgen("models", "info", str(cut)), EXIT_FAILED, "cut short", "cut.gguf")
    with smollm2_draft.open("rb") as whole:
        cut.write_bytes(whole.read(30_000_000))  # the header whole, the weights cut
    one_line(
        specgen("run", "hello", "--target", str(cut)), EXIT_FAILED, "could not load", "cut.gguf"
    )


@pytest.mark.slow
def test_a_prompt_longer_than_the_context_says_both_lengths(smollm2_target: Path) -> None:
    one_line(
        specgen(
            "run", "word " * 600, "--target", str(smollm2_target), "--ctx-size", "256", "--raw"
        ),
        EXIT_FAILED,
        "the prompt (601 tokens)",
        "(256 tokens)",
        "--ctx-size",
    )


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
