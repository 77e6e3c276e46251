"""The command line as a user meets it: which stream gets what, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import with_models_cache

SPECGEN = [sys.executable, "-m", "specgen"]


def specgen(*args: str, input: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPECGEN, *args], input=input if input is not None else "",
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def assert_one_line_error(done: subprocess.CompletedProcess[str], *needles: str,
                          code: int = 1) -> None:
    assert done.returncode == code, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), done.stderr
    assert "Traceback" not in done.stderr
    for needle in needles:
        assert needle in lines[0]


def test_version() -> None:
    done = specgen("--version")
    assert done.returncode == 0 and done.stdout.startswith("specgen ")


def test_unknown_flag_is_a_usage_error_not_a_traceback() -> None:
    done = specgen("run", "--no-such-flag")
    assert done.returncode == 2
    assert "No such option" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_missing_model_file(tmp_path: Path) -> None:
    done = specgen("run", "hello", "--target", str(tmp_path / "nope.gguf"))
    assert_one_line_error(done, "not found", "nope.gguf")


def test_not_a_gguf(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a model at all")
    done = specgen("run", "hello", "--target", str(bogus))
    assert_one_line_error(done, "could not load", "bogus.gguf")


def test_bad_sampling_value(tmp_path: Path) -> None:
    done = specgen("run", "hello", "--target", "x.gguf", "--top-p", "0")
    assert_one_line_error(done, "--top-p", code=2)


def test_empty_prompt_on_stdin() -> None:
    done = specgen("run", "--target", "x.gguf", input="   \n")
    assert_one_line_error(done, "empty", code=2)


def test_prompt_file_missing(tmp_path: Path) -> None:
    done = specgen("run", "-f", str(tmp_path / "missing.txt"), "--target", "x.gguf")
    assert_one_line_error(done, "missing.txt")


# -- on real models ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair_args(smollm2_target: Path, smollm2_draft: Path) -> list[str]:
    return ["--target", str(smollm2_target), "--draft", str(smollm2_draft), "--threads", "2",
            "--temperature", "0", "-n", "24", "--raw"]


@pytest.mark.slow
def test_stdout_holds_only_the_text_and_stats_go_to_stderr(pair_args: list[str]) -> None:
    done = specgen("run", "The capital of France is", *pair_args)
    assert done.returncode == 0, done.stderr
    as_json = specgen("run", "The capital of France is", *pair_args, "--json")
    record = json.loads(as_json.stdout)
    assert done.stdout == record["text"]
    assert "tok/s" in done.stderr and "accept" in done.stderr
    assert "llama" not in done.stderr.lower()  # llama.cpp's own logs stay silent


@pytest.mark.slow
def test_json_is_the_only_thing_on_stdout(pair_args: list[str]) -> None:
    done = specgen("run", "Hello", *pair_args, "--json", "-k", "3")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)  # exactly one JSON document
    stats = record["stats"]
    for key in ("accept_rate", "tokens_per_second", "tokens_per_cycle", "cycles", "drafted",
                "accepted", "prompt_tokens", "prompt_seconds", "generation_seconds", "seed"):
        assert key in stats
    assert stats["lookahead"] == 3 and stats["generated_tokens"] == 24
    assert record["params"]["temperature"] == 0
    assert done.stderr == ""


@pytest.mark.slow
def test_prompt_from_argument_file_and_pipe_agree(pair_args: list[str], tmp_path: Path) -> None:
    prompt = "Three facts about owls:"
    (tmp_path / "p.txt").write_text(prompt)
    by_arg = specgen("run", prompt, *pair_args, "--no-stats")
    by_file = specgen("run", "-f", str(tmp_path / "p.txt"), *pair_args, "--no-stats")
    by_pipe = specgen("run", *pair_args, "--no-stats", input=prompt)
    by_dash = specgen("run", "-f", "-", *pair_args, "--no-stats", input=prompt)
    assert by_arg.stdout and by_arg.stdout == by_file.stdout == by_pipe.stdout == by_dash.stdout
    assert by_arg.stderr == ""  # --no-stats: nothing at all on stderr


@pytest.mark.slow
def test_target_alone_matches_speculative_greedy(pair_args: list[str]) -> None:
    spec = specgen("run", "Once upon a time", *pair_args, "-k", "5", "--json")
    alone = specgen("run", "Once upon a time", *pair_args, "-k", "0", "--json")
    assert json.loads(spec.stdout)["text"] == json.loads(alone.stdout)["text"]
    assert json.loads(alone.stdout)["stats"]["lookahead"] == 0


@pytest.mark.slow
def test_stop_string(pair_args: list[str]) -> None:
    full = json.loads(specgen("run", "Count: 1, 2, 3,", *pair_args, "--json").stdout)["text"]
    stop = full.strip().split(" ")[2]
    done = json.loads(specgen("run", "Count: 1, 2, 3,", *pair_args, "--json",
                              "--stop", stop).stdout)
    assert done["stats"]["stop_reason"] == "stop"
    assert stop not in done["text"] and full.startswith(done["text"])


@pytest.mark.slow
def test_chat_template(pair_args: list[str]) -> None:
    done = specgen("run", "What is 2+2?", *pair_args, "--chat", "--system",
                   "You are terse.", "--json")
    record = json.loads(done.stdout)
    assert record["params"]["chat"] is True
    assert record["stats"]["prompt_tokens"] > 15  # the template's role markers were added
    assert record["text"].strip()


@pytest.mark.slow
def test_ctrl_c_flushes_text_prints_stats_and_exits_130(pair_args: list[str]) -> None:
    args = [a if a != "24" else "2000" for a in pair_args]
    proc = subprocess.Popen([*SPECGEN, "run", "Write a long story about a dragon.", *args,
                             "--chat", "--temperature", "0.7", "--seed", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first = proc.stdout.read(20)  # generation has begun
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert len(first + out) >= 20 and not out.startswith("\n")
    assert "tok/s" in err and "interrupted" in err and "Traceback" not in err


@pytest.mark.slow
def test_full_context_is_reported_not_a_crash(pair_args: list[str]) -> None:
    args = [a if a != "24" else "1000" for a in pair_args]
    done = specgen("run", "Count from one to one thousand: one, two, three,", *args,
                   "--ctx-size", "256")
    assert done.returncode == 0, done.stderr
    assert "context window" in done.stderr and "--ctx-size" in done.stderr
    assert "stop: context_full" in done.stderr and done.stdout


def _run_in_terminal(args: list[str], stdout_tty: bool, rows: int = 24, cols: int = 100,
                     term_after: float | None = None) -> tuple[bytes, bytes, int]:
    """Run specgen with stderr (and maybe stdout) on a pseudo-terminal; return what each got."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)}
    proc = subprocess.Popen([*SPECGEN, *args], stdin=subprocess.DEVNULL,
                            stdout=slave if stdout_tty else subprocess.PIPE, stderr=slave,
                            env=env)
    os.close(slave)
    seen = bytearray()
    started = False
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
        if term_after is not None and not started and b"tok/s" in seen:
            started = True
            import time

            time.sleep(term_after)
            proc.send_signal(signal.SIGTERM)
    out = proc.stdout.read() if proc.stdout else b""
    proc.wait(timeout=60)
    os.close(master)
    return bytes(seen), out, proc.returncode


@pytest.mark.slow
def test_live_bar_in_a_terminal_is_set_up_and_torn_down(pair_args: list[str]) -> None:
    args = [a if a != "24" else "120" for a in pair_args]
    screen, _, code = _run_in_terminal(["run", "Tell me about the moon.", *args, "--chat"],
                                       stdout_tty=True)
    assert code == 0
    assert b"\x1b[1;23r" in screen  # the text scrolls above the bottom row
    assert b"\x1b[24;1H" in screen and b"accept" in screen  # the bar is drawn on that row
    assert screen.rfind(b"\x1b[r") > screen.rfind(b"\x1b[1;23r")  # and given back at the end
    assert b"stop: " in screen.split(b"\x1b[r")[-1]  # final stats after the bar is gone


@pytest.mark.slow
def test_sigterm_during_the_bar_restores_the_terminal(pair_args: list[str]) -> None:
    args = [a if a != "24" else "2000" for a in pair_args]
    screen, _, code = _run_in_terminal(["run", "Write a long story about a dragon.", *args,
                                        "--chat", "--temperature", "0.7", "--seed", "1"],
                                       stdout_tty=True, term_after=0.5)
    assert code == 143
    assert screen.rfind(b"\x1b[r") > screen.rfind(b"\x1b[1;23r")


@pytest.mark.slow
def test_live_stats_on_stderr_when_stdout_is_a_file(pair_args: list[str]) -> None:
    screen, out, code = _run_in_terminal(["run", "The capital of France is", *pair_args],
                                         stdout_tty=False)
    assert code == 0 and out.strip()
    assert b"tok/s" in screen and b"\x1b[" in screen  # Rich drew on the terminal
    assert b"\x1b[" not in out  # the file got only text


def test_lookahead_must_be_a_number_or_auto() -> None:
    done = specgen("run", "hello", "--target", "x.gguf", "-k", "banana")
    assert done.returncode == 2 and "'auto'" in done.stderr and "Traceback" not in done.stderr


def test_a_file_named_ngram_is_reachable_as_a_path(tmp_path: Path) -> None:
    (tmp_path / "ngram").write_bytes(b"not a model")
    target = tmp_path / "t.gguf"
    target.write_bytes(b"not a model either")
    done = subprocess.run([*SPECGEN, "run", "hi", "--target", str(target), "--draft", "./ngram"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "t.gguf" in done.stderr  # the target is loaded first; ./ngram was taken as a file


@pytest.mark.slow
def test_ngram_drafting_needs_no_draft_model(pair_args: list[str], smollm2_target: Path) -> None:
    prompt = "Repeat the list exactly: red, green, blue, yellow. List: red, green,"
    alone = specgen("run", prompt, *pair_args, "-k", "0", "--json")
    by_ngram = specgen("run", prompt, "--target", str(smollm2_target), "--draft", "ngram",
                       "--threads", "2", "--temperature", "0", "-n", "24", "--json", "--raw")
    assert by_ngram.returncode == 0, by_ngram.stderr
    record = json.loads(by_ngram.stdout)
    assert record["text"] == json.loads(alone.stdout)["text"]
    assert record["draft"] is None and record["ngram"] is True
    assert record["stats"]["drafters"]["ngram"]["accepted"] > 0


@pytest.mark.slow
def test_auto_lookahead_reports_its_choices(pair_args: list[str]) -> None:
    done = specgen("run", "Once upon a time", *pair_args, "-k", "auto", "--ngram", "--json")
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)["stats"]
    assert stats["lookahead"] == "auto"
    history = stats["lookahead_history"]
    assert sum(history["cycles_by_k"].values()) == stats["cycles"]
    assert history["target_alone_cycles"] >= 1  # the first cycle times the target alone
    shown = specgen("run", "Once upon a time", *pair_args, "-k", "auto")
    assert "K=auto" in shown.stderr and "accepted" in shown.stderr


# -- the details a new user trips over (#10) ----------------------------------------------------

def test_dash_h_and_readable_placeholders() -> None:
    for command in (["run"], ["bench"], ["models"], ["models", "pull"], ["doctor"], []):
        done = specgen(*command, "-h")
        assert done.returncode == 0, (command, done.stderr)
        assert "Usage" in done.stdout
        for python_type in ("<str>", "<bool>", "<int>", "<float>", "<path>", "<list["):
            assert python_type not in done.stdout, (command, python_type)
    assert "SPEC" in specgen("run", "-h").stdout and "K|auto" in specgen("run", "-h").stdout


def test_help_into_a_closed_pipe_exits_0() -> None:
    proc = subprocess.Popen([*SPECGEN, "run", "--help"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline()
    proc.stdout.close()  # as `| head -1` does
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and b"Error" not in err and b"Traceback" not in err


def test_one_cycle_is_singular() -> None:
    from specgen.stats import Stats
    from specgen.view import stats_text

    stats = Stats(lookahead=0, seed=1, speculative=False)
    stats.n_cycles, stats.n_generated = 1, 1
    text = stats_text(stats).plain
    assert "1 cycle" in text and "1 cycles" not in text and "1 token " in text + " "


def test_final_stats_fit_80_columns() -> None:
    from specgen.stats import SourceStats, Stats
    from specgen.view import stats_text

    stats = Stats(lookahead="auto", seed=4294967295, n_prompt=1234, prompt_seconds=0.5,
                  n_generated=1000, n_cycles=333, n_drafted=2222, n_accepted=1111,
                  current_lookahead=12, stop_reason="max_tokens")
    stats.by_source = {"model": SourceStats(100, 2000, 1000), "ngram": SourceStats(20, 222, 111)}
    wide = stats_text(stats, final=True).plain
    assert len(wide) > 80  # the whole story is long...
    lines = stats_text(stats, final=True, width=80).plain.splitlines()
    assert len(lines) >= 2 and all(len(line) <= 80 for line in lines)  # ...and fits
    assert " ".join(lines).split() == wide.split()  # nothing lost, nothing split mid-word


@pytest.mark.slow
def test_stats_start_on_their_own_line_in_a_shared_log(pair_args: list[str],
                                                       tmp_path: Path) -> None:
    log = tmp_path / "log"
    with log.open("w") as fh:
        done = subprocess.run([*SPECGEN, "run", "The capital of France is", *pair_args, "-n",
                               "5"], stdout=fh, stderr=subprocess.STDOUT, timeout=300)
    assert done.returncode == 0
    text = log.read_text()
    stats_line = next(line for line in text.splitlines() if "tok/s" in line)
    assert stats_line.startswith(("K=", "target alone")), text
    assert all(len(line) <= 80 for line in text.splitlines()[1:]), text


@pytest.mark.slow
def test_chat_by_default_for_an_instruct_gguf(smollm2_target: Path) -> None:
    args = ["--target", str(smollm2_target), "--temperature", "0", "-n", "16", "--json"]
    chat = json.loads(specgen("run", "What is 2+2?", *args).stdout)
    raw = json.loads(specgen("run", "What is 2+2?", *args, "--raw").stdout)
    assert chat["params"]["chat"] is True and raw["params"]["chat"] is False
    assert chat["text"].strip()
    assert chat["stats"]["prompt_tokens"] > raw["stats"]["prompt_tokens"] + 5  # the template
    system = json.loads(specgen("run", "Hi", *args, "--system", "Be brief.").stdout)
    assert system["params"]["chat"] is True
    refused = specgen("run", "Hi", *args, "--system", "Be brief.", "--raw")
    assert refused.returncode == 2 and "--system needs a chat" in refused.stderr


@pytest.mark.slow
def test_an_answer_with_no_text_is_said(smollm2_target: Path) -> None:
    prompt = r"<|im_start|>user\nSay OK.<|im_end|>\n<|im_start|>assistant\nOK."
    done = specgen("run", prompt, "--target", str(smollm2_target), "--raw", "--temperature",
                   "0", "-n", "8")
    assert done.returncode == 0 and done.stdout == ""
    assert "ended its answer before any text" in done.stderr


@pytest.mark.slow
def test_stop_escapes_match_a_real_newline(pair_args: list[str]) -> None:
    prompt = "Write three lines about the sea.\n"
    free = json.loads(specgen("run", prompt, *pair_args, "--json").stdout)["text"]
    assert "\n" in free  # without a stop the text has a newline
    done = specgen("run", prompt, *pair_args, "--stop", r"\n", "--json")
    stopped = json.loads(done.stdout)
    assert stopped["stats"]["stop_reason"] == "stop" and "\n" not in stopped["text"]
    assert stopped["params"]["stop"] == ["\n"]
    literal = json.loads(specgen("run", prompt, *pair_args, "--stop", r"\n", "--no-escape",
                                 "--json").stdout)
    assert literal["params"]["stop"] == ["\\n"] and literal["stats"]["stop_reason"] != "stop"


@pytest.mark.slow
def test_argument_and_piped_text_are_combined(pair_args: list[str]) -> None:
    piped = specgen("run", "Translate to French:", *pair_args, "--json",
                    input="Good morning, my friend.\n")
    joined = specgen("run", r"Translate to French:\nGood morning, my friend.", *pair_args,
                     "--json")
    a, b = json.loads(piped.stdout), json.loads(joined.stdout)
    assert a["text"] == b["text"] and a["stats"]["prompt_tokens"] == b["stats"]["prompt_tokens"]


@pytest.mark.slow
def test_piped_prompt_loses_its_trailing_newline(pair_args: list[str]) -> None:
    piped = json.loads(specgen("run", *pair_args, "--json", input="Name three colours:\n").stdout)
    argument = json.loads(specgen("run", "Name three colours:", *pair_args, "--json").stdout)
    assert piped["text"] == argument["text"]
    assert piped["stats"]["prompt_tokens"] == argument["stats"]["prompt_tokens"]


@pytest.mark.slow
def test_ctrl_c_while_loading_stops_at_once(smollm2_target: Path, smollm2_draft: Path) -> None:
    """A real SIGINT during the load: no tokens, one line of ours, exit 130."""
    import time

    proc = subprocess.Popen([*SPECGEN, "run", "Tell me a long story.", "--target",
                             str(smollm2_target), "--draft", str(smollm2_draft), "-n", "500",
                             "--verbose"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stderr is not None
    seen = b""
    while b"llama_model_loader" not in seen:  # llama.cpp has started reading the target
        chunk = proc.stderr.readline()
        assert chunk, seen
        seen += chunk
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    waited = time.monotonic() - sent
    assert proc.returncode == 130, err[-2000:]
    assert out == b""  # nothing was generated
    assert b"Exception ignored" not in err and b"Traceback" not in err
    assert err.decode().strip().splitlines()[-1] == "interrupted while loading the models"
    assert waited < 10  # the load was not finished first (it takes ~1 s), let alone 500 tokens


@pytest.mark.slow
def test_pair_target_and_draft_rule(smollm2_target: Path, smollm2_draft: Path) -> None:
    # --target alone: your own target, alone (no pair's draft mixed in)
    alone = json.loads(specgen("run", "Hi", "--target", str(smollm2_target), "-n", "4",
                               "--json").stdout)
    assert alone["draft"] is None and alone["pair"] is None
    # --pair with --draft: the pair's target with your draft
    mixed = specgen("run", "Hi", "--pair", "smollm2-135m-demo", "--draft", str(smollm2_draft),
                    "-n", "4", "--json", env=with_models_cache())
    record = json.loads(mixed.stdout)
    assert record["pair"] == "smollm2-135m-demo" and record["draft"] == str(smollm2_draft)
