"""Batches: every prompt of a file, one JSON line each, errors as lines, resume; on fake models
in this process, and Ctrl-C on them in a process of its own."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import FakePair
from tests.invoke import specgen_here as specgen
from tests.invoke import specgen_popen, specgen_process

# Without --parallel a file runs up to 4 prompts at once on this CPU, one sequence for each of
# a file of fewer (``session.fit.auto_parallel``); with --parallel 1 one after another, as a
# GPU's or a recurrent target's does: both ways.
WAYS = pytest.mark.parametrize("way", [(), ("--parallel", "1")], ids=["default", "one-at-a-time"])


@pytest.fixture(params=[(), ("--parallel", "1")], ids=["default", "one-at-a-time"])
def models(fake_pair: FakePair, request: pytest.FixtureRequest) -> list[str]:
    return fake_pair.args("--temperature", "0", "-n", "12", "--raw", *request.param)


def lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_each_line_matches_single_runs(models: list[str], tmp_path: Path) -> None:
    prompts = ["The capital of France is", "List three colours:", "def add(a, b):"]
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(prompts) + "\n")
    done = specgen("run", "-f", str(path), "--each-line", *models)
    assert done.returncode == 0, done.stderr
    records = lines(done.stdout)
    assert [r["id"] for r in records] == [1, 2, 3]
    for record, prompt in zip(records, prompts):
        single = json.loads(specgen("run", prompt, *models, "--json").stdout)
        assert record["text"] == single["text"]  # greedy: the batch is the same generation
        assert record["stats"]["generated_tokens"] == single["stats"]["generated_tokens"]
    assert "batch: 3 of 3 prompts done" in done.stderr


def test_jsonl_settings_bad_lines_and_exit_code(models: list[str], tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps({"id": "short", "prompt": "Once upon a time", "max_tokens": 3}),
                "{not json",
                json.dumps(
                    {
                        "id": "chat",
                        "messages": [{"role": "user", "content": "Hi!"}],
                        "max_tokens": 8,
                        "seed": 3,
                        "temperature": 0.7,
                    }
                ),
                json.dumps({"id": "nothing"}),
                json.dumps({"id": "stop", "prompt": "One, two, three, four,", "stop": [" "]}),
            ]
        )
        + "\n"
    )
    out = tmp_path / "out.jsonl"
    done = specgen("run", "-f", str(path), "-o", str(out), *models)
    assert done.returncode == 1, done.stderr  # some lines failed
    assert done.stdout == ""  # everything went to -o
    records = {r["id"]: r for r in lines(out.read_text())}
    assert records["short"]["stats"]["generated_tokens"] == 3
    assert records[2]["error"].startswith("line 2: not valid JSON")
    assert "exactly one of 'prompt'" in records["nothing"]["error"]
    assert records["chat"]["stats"]["seed"] == 3 and records["chat"]["text"]
    assert " " not in records["stop"]["text"] and records["stop"]["stats"]["stop_reason"] == "stop"
    assert "2 failed" in done.stderr


def test_resume_skips_what_is_done_and_appends(models: list[str], tmp_path: Path) -> None:
    path = tmp_path / "prompts.txt"
    path.write_text("Alpha\nBeta\nGamma\n")
    out = tmp_path / "out.jsonl"
    out.write_text(
        json.dumps({"id": 1, "text": "earlier", "stats": {}})
        + "\n"
        + json.dumps({"id": 2, "line": 2, "error": "earlier failure"})
        + "\n"
        + '{"id": 3, "text": "cut sho'
    )  # a line a crash cut short
    done = specgen("run", "-f", str(path), "--each-line", "-o", str(out), "--resume", *models)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert text.startswith(json.dumps({"id": 1, "text": "earlier", "stats": {}}))  # kept
    new = [json.loads(line) for line in text.splitlines()[3:]]
    assert [r["id"] for r in new] == [2, 3]  # the failure and the cut line run again
    assert "1 skipped" in done.stderr


def test_stdin_batch_and_a_prompt_too_long_for_the_context(models: list[str]) -> None:
    long_line = "word " * 400
    done = specgen(
        "run",
        "-f",
        "-",
        "--each-line",
        *models,
        "--ctx-size",
        "256",
        input=f"Hello there\n{long_line}\n",
    )
    assert done.returncode == 1
    first, second = lines(done.stdout)
    assert first["text"] and second["error"].startswith("line 2: the prompt (")
    assert "does not fit the context (256 tokens)" in second["error"]


@WAYS
def test_ctrl_c_in_a_batch_keeps_finished_lines_and_resume_finishes(
    fake_pair: FakePair, tmp_path: Path, way: tuple[str, ...]
) -> None:
    import signal
    import time

    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(f"Tell me about the number {i}." for i in range(12)) + "\n")
    out = tmp_path / "out.jsonl"
    # Each decode takes real time, so the signal finds the batch part-way.
    args = fake_pair.busy(0.001).args("--temperature", "0", "-n", "16", "--raw", *way)
    batch = ["run", "-f", str(path), "--each-line", "-o", str(out), *args]
    proc = specgen_popen(
        *batch, fakes=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not out.exists() or out.read_text().count("\n") < 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted (run again with --resume" in err and "Traceback" not in err
    done = lines(out.read_text())  # every line written is whole
    assert 2 <= len(done) < 12 and all("text" in r for r in done)
    again = specgen_process(*batch, "--resume", fakes=True)
    assert again.returncode == 0, again.stderr
    assert sorted(r["id"] for r in lines(out.read_text())) == list(range(1, 13))


def test_a_line_s_penalties_over_the_run_s(models: list[str], tmp_path: Path) -> None:
    """A line's penalty fields change only what they name: the run's --repeat-penalty stays
    under a line's presence_penalty; a bad value fails its own line."""
    prompt = "One, two, three, four,"
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(record)
            for record in (
                {"id": "both", "prompt": prompt, "presence_penalty": 0.9},
                {"id": "run", "prompt": prompt},
                {"id": "bad", "prompt": prompt, "repeat_last_n": "all"},
            )
        )
        + "\n"
    )
    done = specgen("run", "-f", str(path), *models, "--repeat-penalty", "1.4")
    assert done.returncode == 1, done.stderr
    records = {r["id"]: r for r in lines(done.stdout)}

    def single(*flags: str) -> str:
        return json.loads(specgen("run", prompt, *models, *flags, "--json").stdout)["text"]

    both = single("--repeat-penalty", "1.4", "--presence-penalty", "0.9")
    assert records["both"]["text"] == both
    assert records["run"]["text"] == single("--repeat-penalty", "1.4") != both
    assert "'repeat_last_n' must be a whole number" in records["bad"]["error"]
