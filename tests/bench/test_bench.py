"""The bench's statistics on fakes with known costs and acceptance, short benches on fake models,
and one on them in a process of its own, cut short by Ctrl-C."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from specgen.bench.export import CSV_FIELDS
from specgen.bench.prompts import load_prompts
from specgen.bench.report import summarize
from specgen.bench.streams import StreamsRow, best_streams, streams_advice
from specgen.bench.sweep import parse_lookaheads, sweep
from specgen.core.speculative import expected_tokens
from specgen.errors import UserError
from specgen.stats import SourceStats, Stats
from specgen.structured.grammar import any_json_object
from tests.conftest import FakePair
from tests.invoke import one_line_error, specgen_here, specgen_popen

DRAFT, TARGET = 1.0, 4.0  # seconds per token, fake


def verify_cost(k: int) -> float:
    return TARGET * (1 + 0.1 * k)


def fake_runner(alpha: float | Callable[[int], float], cycles: int = 4000, overhead: float = 0.0):
    """Runs whose guesses survive with probability alpha (or alpha(position)), timed by a
    fixed cost model."""
    survive = alpha if callable(alpha) else (lambda position: alpha)

    def run_one(prompt: int, k: int, seed: int) -> Stats:
        rng = np.random.default_rng(seed * 1000 + prompt * 10 + k)
        stats = Stats(lookahead=k, seed=seed)
        stats.reached_at, stats.accepted_at = [0] * k, [0] * k
        stats.n_generated = 1  # the prompt's own pass gives the first token
        for _ in range(cycles):
            n = 0
            while n < k and rng.random() < survive(n):
                n += 1
            for i in range(min(n + 1, k)):
                stats.reached_at[i] += 1
                stats.accepted_at[i] += i < n
            stats.n_cycles += 1
            stats.n_drafted += k
            stats.n_accepted += n
            stats.n_rejected += n < k
            stats.n_generated += n + 1
        stats.draft_seconds = DRAFT * stats.n_drafted
        stats.target_seconds = verify_cost(k) * stats.n_cycles
        stats.gen_seconds = (stats.draft_seconds + stats.target_seconds) * (1 + overhead)
        stats.stop_reason = "max_tokens"
        return stats

    return run_one


def exact_speedup(alpha: float, k: int) -> float:
    return expected_tokens(alpha, k) * TARGET / (k * DRAFT + verify_cost(k))


def test_a_drafts_catch_up_is_not_counted_as_the_cost_of_its_guesses() -> None:
    """After speculation was off, a draft model reads what it missed before it guesses: that
    time is in draft_seconds (and the speedup) but not in the per-guess cost and c."""
    plain = fake_runner(0.8, cycles=200)

    def caught_up(prompt: int, k: int, seed: int) -> Stats:
        stats = plain(prompt, k, seed)
        stats.catch_up_seconds = 3 * DRAFT * stats.n_cycles if k else 0.0
        stats.draft_seconds += stats.catch_up_seconds
        stats.gen_seconds += stats.catch_up_seconds
        return stats

    report = summarize(sweep(caught_up, 2, [2, 4], 1, seed=1))
    for row in report.per_k:
        assert row.cost_ratio == pytest.approx(DRAFT / TARGET)
        assert row.draft_ms_per_token == pytest.approx(DRAFT * 1000)
        assert row.speedup < exact_speedup(0.8, row.variant)


def test_sweep_interleaves_and_warms_up() -> None:
    calls: list[tuple[int, int]] = []

    def run_one(prompt: int, k: int, seed: int) -> Stats:
        calls.append((prompt, k))
        return fake_runner(0.5, cycles=10)(prompt, k, seed)

    runs = sweep(run_one, n_prompts=2, variants=[2, 4], repeats=2, seed=0)
    assert calls[0] == (0, 4)  # the warm-up, not counted
    assert calls[1:7] == [(0, 0), (0, 2), (0, 4), (1, 0), (1, 2), (1, 4)]
    assert len(runs) == 12 and calls[7:] == calls[1:7]


@pytest.mark.parametrize("alpha", [0.5, 0.8, 0.95])
def test_costs_prediction_and_measurement_on_known_fakes(alpha: float) -> None:
    ks = [1, 2, 4, 8]
    report = summarize(sweep(fake_runner(alpha), 3, ks, 1, seed=1))
    assert report.target_ms_per_token == pytest.approx(TARGET * 1000)
    for row in report.per_k:
        assert row.cost_ratio == pytest.approx(DRAFT / TARGET)
        assert row.verify_ratio == pytest.approx(1 + 0.1 * row.variant)
        assert row.accept_rate == pytest.approx(alpha, abs=0.02)
        assert all(r == pytest.approx(alpha, abs=0.04) for r in row.position_accept_rates[:4])
        assert row.speedup == pytest.approx(exact_speedup(alpha, row.variant), rel=0.03)
        assert row.predicted_speedup == pytest.approx(row.speedup, rel=0.03)
        assert row.explanation == ""
    best = max(ks, key=lambda k: exact_speedup(alpha, k))
    assert report.recommended == best and not report.warning


def test_no_k_beats_the_target_alone() -> None:
    report = summarize(sweep(fake_runner(0.05), 2, [1, 2, 4], 1, seed=0))
    assert all(row.speedup < 1 for row in report.per_k)
    assert report.recommended is None and "not worth" in report.warning


def test_rows_outside_load_disturbed_are_marked_and_never_recommended() -> None:
    """The fastest row ran while another process held a CPU (its runs look faster or slower
    for reasons of the machine's, not the pair's): it is marked, and the best clean row is
    recommended; when the target-alone runs were disturbed, so is every row beside them."""
    import io

    from rich.console import Console

    from specgen.cli.bench_report import render

    honest = fake_runner(0.8)

    def run(prompt: int, k: int, seed: int) -> Stats:
        stats = honest(prompt, k, seed)
        if k == 2:
            stats.outside_load = 1.0
        return stats

    clean = summarize(sweep(honest, 2, [2, 6], 1, seed=0))
    assert clean.recommended == 2 and clean.disturbed_runs == 0  # the fastest, when honest
    report = summarize(sweep(run, 2, [2, 6], 1, seed=0))
    rows = {row.variant: row for row in report.per_k}
    assert rows[2].disturbed == 2 and rows[6].disturbed == 0
    assert report.recommended == 6 and report.disturbed_runs == 2

    def alone_loaded(prompt: int, k: int, seed: int) -> Stats:
        stats = honest(prompt, k, seed)
        stats.outside_load = 1.5 if k == 0 else 0.0
        return stats

    every = summarize(sweep(alone_loaded, 2, [2, 6], 1, seed=0))
    assert all(row.disturbed for row in every.per_k) and every.recommended is None
    assert "busy during every row" in every.warning
    text = io.StringIO()
    Console(file=text, width=200).print(render(report, "demo"))
    assert "2!" in text.getvalue() and "not recommended from" in text.getvalue()


def test_a_bench_under_outside_load_remembers_nothing(tmp_path: Path, fake_pair: FakePair) -> None:
    three = tmp_path / "three.txt"
    three.write_text("List three colours:\nOnce upon a time\nThe sea is\n")
    fake_pair.clock.outside_load = 1.2  # another process holds a CPU all along
    done = specgen_here(
        "bench", "--pair", fake_pair.named(), "-k", "4", "--temperature", "0",
        "--prompts", str(three), "-n", "96",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "busy during 6 of the runs: nothing remembered" in done.stderr
    memos = Path(os.environ["SPECGEN_CACHE"]) / "bench"
    assert not memos.is_dir() or not list(memos.glob("*.json"))


def test_disagreement_is_explained_by_the_right_cost() -> None:
    report = summarize(sweep(fake_runner(0.9, overhead=0.5), 2, [4], 1, seed=0))
    row = report.per_k[0]
    # Overhead only in speculative runs? No: the fake adds it to every run, K=0 included, so the
    # ratio is unchanged and the model still agrees.
    assert row.explanation == ""

    def uneven(prompt: int, k: int, seed: int) -> Stats:
        stats = fake_runner(0.9)(prompt, k, seed)
        if k:
            stats.gen_seconds *= 1.6  # time spent outside the two models, speculative runs only
        return stats

    row = summarize(sweep(uneven, 2, [4], 1, seed=0)).per_k[0]
    assert row.disagreement is not None and row.disagreement > 0.15
    assert "overestimates" in row.explanation and "outside the two models" in row.explanation


def test_acceptance_that_is_not_independent_is_named() -> None:
    """Runs of sure guesses then a sure miss: the one-alpha formula undercounts tokens/cycle."""

    falling = fake_runner(lambda position: 1.0 if position < 6 else 0.0, cycles=3000)
    row = summarize(sweep(falling, 1, [8], 1, seed=0)).per_k[0]
    assert row.position_accept_rates[:7] == [1, 1, 1, 1, 1, 1, 0]
    assert row.tokens_per_cycle == 7 and row.predicted_tokens_per_cycle < 5.5
    assert "underestimates" in row.explanation
    assert "do not survive independently" in row.explanation


def test_lookahead_list_and_prompt_files(tmp_path: Path) -> None:
    assert parse_lookaheads("4, 1,2,2,0") == [1, 2, 4]
    assert parse_lookaheads("hybrid,8,auto,NGRAM,2") == [2, 8, "auto", "ngram", "hybrid"]
    assert parse_lookaheads("ngram") == ["ngram"]
    for bad in ("a,b", "0", "-1,2", "65", "fast,2"):
        with pytest.raises(UserError):
            parse_lookaheads(bad)
    plain = tmp_path / "p.txt"
    plain.write_text("first prompt\n\nsecond\\nwith a newline\n")
    assert load_prompts(plain) == (["first prompt", "second\nwith a newline"], [None, None])
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a"}\n{"prompt": "b", "id": 2, "format": "json"}\n')
    prompts, grammars = load_prompts(jsonl)
    assert prompts == ["a", "b"] and grammars == [None, any_json_object()]
    jsonl.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    with pytest.raises(UserError, match="line 2"):
        load_prompts(jsonl)


def test_a_short_bench_writes_every_field(tmp_path: Path, fake_pair: FakePair) -> None:
    prompts = tmp_path / "prompts.txt"
    # three prompts of 96 tokens: the least sample bench remembers from (memo.too_small)
    prompts.write_text("The capital of France is\nList three colours:\nOnce upon a time\n")
    outputs = {name: tmp_path / f"bench.{name}" for name in ("json", "csv", "png")}
    pair = fake_pair.named()
    done = specgen_here(
        "bench",
        "--pair",
        pair,
        "-k",
        "2,4",
        "-n",
        "96",
        "--prompts",
        str(prompts),
        "--threads",
        "2",
        "--json",
        str(outputs["json"]),
        "--csv",
        str(outputs["csv"]),
        "--plot",
        str(outputs["png"]),
    )
    assert done.returncode == 0, done.stderr
    assert "recommended" in done.stdout or "warning" in done.stdout
    # by default both greedy and `run`'s own sampling are measured, each with its verdict
    greedy, sampled = json.loads(outputs["json"].read_text())["reports"]
    assert greedy["meta"]["params"]["temperature"] == 0.0
    assert sampled["meta"]["params"]["temperature"] == 0.8
    assert sampled["meta"]["params"]["top_k"] == 40 and sampled["meta"]["params"]["top_p"] == 0.95
    for record in (greedy, sampled):
        assert record["runs"] == 3 * 3 and len(record["per_k"]) == 2
        for row in record["per_k"]:
            for key in (
                "lookahead",
                "tokens_per_second",
                "speedup",
                "predicted_speedup",
                "accept_rate",
                "position_accept_rates",
                "tokens_per_cycle",
                "draft_ms_per_token",
                "verify_ms",
                "cost_ratio",
                "disagreement",
            ):
                assert key in row
            assert len(row["position_accept_rates"]) == row["lookahead"]
    meta = greedy["meta"]
    assert meta["machine"]["llama_cpp_system_info"] and meta["machine"]["target_threads"] == 2
    assert meta["target"]["file"].endswith(".gguf") and meta["params"]["max_tokens"] == 96
    assert meta["title"] == f"{pair}, 2 threads, T=0.0" and meta["partial"] is False
    rows = list(csv.reader(outputs["csv"].open()))
    assert rows[0] == CSV_FIELDS  # a plain CSV: the header on line 1
    assert [(float(r[0]), r[1]) for r in rows[1:]] == [
        (0.0, "2"),
        (0.0, "4"),
        (0.8, "2"),
        (0.8, "4"),
    ]
    assert outputs["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "--temperature 0 " in done.stdout and '"..."' not in done.stdout
    assert " -t 2 " in done.stdout  # the command recommended runs as bench ran
    # `run` now uses what bench found for this pair here, and says so
    ran = specgen_here(
        "run", "Hi", "--pair", pair, "--threads", "2", "-n", "4", "--temperature", "0", "--json"
    )
    record = json.loads(ran.stdout)
    best = greedy["recommended_lookahead"]
    expected = 0 if best is None else best
    assert record["params"]["lookahead"] == expected
    quiet = specgen_here(
        "run", "Hi", "--pair", pair, "--threads", "2", "-n", "4", "--temperature", "0"
    )
    assert "what `specgen bench` found best here" in quiet.stderr
    chosen = specgen_here(
        "run",
        "Hi",
        "--pair",
        pair,
        "--threads",
        "2",
        "-n",
        "4",
        "--temperature",
        "0",
        "-k",
        "3",
        "--json",
    )
    assert json.loads(chosen.stdout)["params"]["lookahead"] == 3  # -k still wins


def test_bench_earns_the_right_to_change_defaults(
    tmp_path: Path, fake_pair: FakePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bench too small, or told --no-remember, changes nothing run does; --forget undoes
    what a whole one remembered; --plot without matplotlib stops before any work."""
    pair = fake_pair.named()
    one = tmp_path / "one.txt"
    one.write_text("List three colours:\n")
    three = tmp_path / "three.txt"
    three.write_text("List three colours:\nOnce upon a time\nThe sea is\n")
    memos = Path(os.environ["SPECGEN_CACHE"]) / "bench"

    def bench(prompts: Path, *extra: str) -> str:
        done = specgen_here(
            "bench", "--pair", pair, "-k", "4", "--temperature", "0", "--prompts", str(prompts),
            *extra,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stderr

    said = bench(one, "-n", "8")
    assert "too small a sample" in said and "nothing remembered" in said
    assert "bench: 2 runs of up to 8 tokens" in said  # what it is about to do, first
    assert not list(memos.glob("*.json")) if memos.is_dir() else True
    assert "--no-remember" in bench(three, "-n", "96", "--no-remember")
    assert not memos.is_dir() or not list(memos.glob("*.json"))
    bench(three, "-n", "96")
    assert len(list(memos.glob("*.json"))) == 1
    assert "forgot what bench found" in bench(three, "--forget")
    assert not list(memos.glob("*.json"))
    assert "remembered nothing" in bench(three, "--forget")

    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    done = specgen_here("bench", "--pair", pair, "--plot", str(tmp_path / "p.png"))
    one_line_error(done, "--plot needs matplotlib", code=2)


def test_bench_leaves_the_costs_auto_learned_for_run(tmp_path: Path, fake_pair: FakePair) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("List three colours:\n")
    costs = Path(os.environ["SPECGEN_CACHE"]) / "costs"
    done = specgen_here(
        "bench",
        "--pair",
        fake_pair.named(),
        "-k",
        "auto",
        "-n",
        "12",
        "--prompts",
        str(prompts),
        "--threads",
        "2",
        "--temperature",
        "0",
    )
    assert done.returncode == 0, done.stderr
    (kept,) = costs.glob("*.json")
    learned = json.loads(kept.read_text())
    greedy = learned["greedy"]
    # The fake clock: a target pass is 10 ms plus 1 ms a token, a draft step 2 ms.
    assert greedy["verify_by_n"]["1"] == pytest.approx(0.011)
    assert greedy["per_guess"]["model"] == pytest.approx(0.002)
    assert not learned["sampled"]["verify_by_n"]  # only greedy was measured


def test_interrupted_bench_prints_and_writes_what_it_measured(
    fake_pair: FakePair, tmp_path: Path
) -> None:
    """A real SIGINT part-way: the partial table, the partial JSON and CSV, exit 130."""
    import fcntl
    import pty
    import signal
    import struct
    import termios

    prompts = tmp_path / "prompts.txt"
    prompts.write_text(
        "\n".join(f"Prompt number {i}: tell me about the number {i}." for i in range(8)) + "\n"
    )
    out_json, out_csv = tmp_path / "b.json", tmp_path / "b.csv"
    master, slave = pty.openpty()  # stderr on a terminal, so the progress bar shows
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = specgen_popen(
        "bench",
        *fake_pair.busy().args(),  # each decode takes real time: the signal finds it part-way
        "-k",
        "2,4",
        "-n",
        "16",
        "--prompts",
        str(prompts),
        "--json",
        str(out_json),
        "--csv",
        str(out_csv),
        env={"TERM": "xterm"},
        fakes=True,
        stdout=subprocess.PIPE,
        stderr=slave,
    )
    os.close(slave)
    seen = b""
    while b"prompt 3/8" not in seen:
        chunk = os.read(master, 4096)
        assert chunk, seen
        seen += chunk
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    os.close(master)
    assert proc.returncode == 130
    assert b"partial" in out and b"speedup" in out
    record = json.loads(out_json.read_text())
    assert record["meta"]["partial"] is True and 0 < record["runs"] < 8 * 3
    assert list(csv.reader(out_csv.open()))[0] == CSV_FIELDS


def adaptive_runner(prompt: int, k, seed: int) -> Stats:
    """Fixed K's as fake_runner; the adaptive rows as runs that chose K's and sources."""
    if isinstance(k, int):
        return fake_runner(0.8, cycles=200)(prompt, k, seed)
    stats = fake_runner(0.8, cycles=200)(prompt, 6, seed)
    stats.lookahead = "auto"
    stats.k_counts = {0: 20, 6: 180}
    stats.by_source = {"ngram": SourceStats(100, 600, 450), "model": SourceStats(100, 600, 450)}
    if k == "ngram" and prompt == 1:
        stats.gen_seconds /= 3  # prompt lookup shines on the second prompt only
    return stats


def test_adaptive_rows_per_kind_and_per_prompt() -> None:
    runs = sweep(adaptive_runner, 2, [2, 6, "auto", "ngram", "hybrid"], 1, seed=0)
    report = summarize(runs, kinds=["story", "rewrite"])
    rows = {row.variant: row for row in report.per_k}
    assert list(rows) == [2, 6, "auto", "ngram", "hybrid"]
    assert rows["auto"].predicted_speedup is None and rows[6].predicted_speedup is not None
    assert rows["auto"].mean_lookahead == pytest.approx(5.4)
    assert rows["auto"].target_alone_share == pytest.approx(0.1)
    assert rows["hybrid"].ngram_share == pytest.approx(0.5)
    assert report.per_prompt[1]["ngram"] == pytest.approx(3 * report.per_prompt[1]["auto"])
    assert report.per_prompt[0]["ngram"] == pytest.approx(report.per_prompt[0]["auto"])
    assert report.per_kind["rewrite"]["ngram"] == report.per_prompt[1]["ngram"]
    # Prompt lookup ran fastest on one prompt of two: not beyond the noise, so the row that
    # adapts is recommended, and the report says why.
    assert report.recommended == "hybrid"
    assert report.note.startswith("ngram ran fastest") and "2 runs" in report.note
    record = report.as_dict()
    assert record["per_kind"]["story"]["auto"] == report.per_kind["story"]["auto"]
    assert len(record["per_prompt"]) == 2


def timed_runner(speedup: Callable[[int, object, int], float]):
    """Runs of 100 tokens at ``speedup(prompt, variant, repeat)`` times the target alone."""

    def run_one(prompt: int, k, seed: int) -> Stats:
        stats = Stats(lookahead=k, seed=seed)
        stats.n_generated, stats.n_cycles = 100, 100
        stats.target_seconds = stats.gen_seconds = 10.0 / (speedup(prompt, k, seed) if k else 1)
        return stats

    return run_one


@pytest.mark.parametrize("spread, fixed_wins", [(0.02, True), (0.5, False)])
def test_a_row_that_adapts_is_recommended_unless_another_wins_beyond_the_noise(
    spread: float, fixed_wins: bool
) -> None:
    """K=4 runs 10% faster than hybrid by the median over 8 prompts, with run-by-run noise of
    2% (greedy: the same text, a quiet machine) or 50% (sampled texts that differ)."""
    noise = np.random.default_rng(0).normal(0.0, spread, size=(8, 2))

    def speedup(prompt: int, k, seed: int) -> float:
        return 1.5 * (1.1 * math.exp(noise[prompt, seed]) if k == 4 else 1.0)

    report = summarize(sweep(timed_runner(speedup), 8, [4, "auto", "hybrid"], 2, seed=0))
    speedups = {row.variant: row.speedup for row in report.per_k}
    assert max(speedups, key=speedups.get) == 4
    assert report.recommended == (4 if fixed_wins else "hybrid")
    assert bool(report.note) != fixed_wins
    assert report.as_dict()["note"] == report.note


def test_an_adaptive_row_says_when_its_draft_cost_rests_on_a_few_guesses() -> None:
    """auto on a draft that cannot pay drafts only its probes: its draft and c rest on them."""
    import io

    from rich.console import Console

    from specgen.cli.bench_report import render

    def cannot_pay(prompt: int, k, seed: int) -> Stats:
        stats = adaptive_runner(prompt, k, seed)
        if k == "auto":
            stats.n_drafted, stats.k_counts = 1, {0: 199, 1: 1}
            stats.by_source = {"model": SourceStats(1, 1, 0)}
        return stats

    report = summarize(sweep(cannot_pay, 1, [2, "auto", "hybrid"], 1, seed=0))
    rows = {row.variant: row for row in report.per_k}
    assert rows["auto"].model_guesses == 1 and rows["hybrid"].model_guesses == 600
    buf = io.StringIO()
    Console(file=buf, width=200).print(render(report, "demo"))
    lines = buf.getvalue().splitlines()
    assert any("auto" in line and "rest on 1 draft-model guess" in line for line in lines)
    assert not any("hybrid" in line and "rest on" in line for line in lines)


def test_the_table_fits_80_columns_without_cutting_a_header() -> None:
    import io

    from rich.console import Console

    from specgen.cli.bench_report import render
    from specgen.session.memo import variant_options

    runs = sweep(adaptive_runner, 2, [1, 2, 3, 4, 6, 8, "auto", "ngram", "hybrid"], 1, seed=0)
    report = summarize(runs, kinds=["story", "rewrite"])
    report.title = "gemma3-270m-demo, 2 threads, T=0.0"
    buf = io.StringIO()
    Console(file=buf, width=80, force_terminal=False).print(render(report, "demo"))
    text = buf.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "\u2026" not in text  # no header or cell cut short
    for header in ("speedup", "tok/cyc", "verify", "hybrid"):
        assert header in text
    assert "specgen run --pair demo --ngram -k auto" in text
    assert "ngram ran fastest" in text  # why the recommendation is not the fastest row
    assert (
        variant_options(4, None, Path("/m/big model.gguf"), Path("/m/d.gguf"))
        == "--target '/m/big model.gguf' --draft /m/d.gguf --no-ngram -k 4"
    )
    assert variant_options("hybrid", "p", None, None) == "--pair p --ngram -k auto"


def test_short_runs_blame_the_token_budget_not_acceptance() -> None:
    """Cycles cut short by --max-tokens draft fewer than K guesses: the explanation says so
    instead of blaming acceptance by position."""
    full = fake_runner(0.9, cycles=20)

    def short(prompt: int, k: int, seed: int) -> Stats:
        stats = full(prompt, k, seed)
        if k:  # as if every cycle had only a third of its K left in the budget
            stats.n_drafted //= 3
            stats.n_generated //= 3
        return stats

    report = summarize(sweep(short, 2, [8], 1, seed=0))
    (row,) = report.per_k
    assert row.explanation and "--max-tokens" in row.explanation
    assert "by position" not in row.explanation


def test_the_cache_row_sees_the_prompts_before_it_and_the_others_do_not(
    tmp_path: Path, fake_pair: FakePair
) -> None:
    """The same prompt twice: in the cache row, the second run is guessed from the first's
    text (its share of cache guesses is large); hybrid's runs start from nothing."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The capital of France is\nThe capital of France is\n")
    out = tmp_path / "bench.json"
    done = specgen_here(
        "bench", "--pair", fake_pair.named(), "-k", "hybrid,cache", "-n", "24", "--repeats",
        "2", "--prompts", str(prompts), "--temperature", "0", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    rows = {row["lookahead"]: row for row in report["per_k"]}
    assert rows["hybrid"]["cache_share"] == 0
    assert rows["cache"]["cache_share"] > 0.3
    first, second = report["per_prompt"]
    assert second["cache"] > first["cache"]  # the second prompt is the one the cache knows
    assert "earlier prompts" in done.stdout


def test_bench_streams_measures_several_at_once(tmp_path: Path, fake_pair: FakePair) -> None:
    """``bench --streams 1,2``: a table of aggregate tokens/s by streams at once, with -k auto
    and the target alone, and the count that gave the most. On the fakes a pass costs 10 ms
    plus 1 ms a token, so two streams in one pass beat one stream at a time."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The capital of France is\nList three colours:\nCount to ten:\nHello\n")
    done = specgen_here(
        "bench", "--pair", fake_pair.named(), "-k", "2", "-n", "12", "--prompts", str(prompts),
        "--temperature", "0", "--streams", "1,2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Streams at once" in done.stdout
    rows = {}
    for line in done.stdout.splitlines():
        cells = [c.strip() for c in line.split("│") if c.strip()]
        if len(cells) == 4 and cells[0] in ("1", "2"):
            rows[int(cells[0])] = (float(cells[1]), float(cells[2]))
    assert set(rows) == {1, 2}, done.stdout
    assert rows[2][1] > 1.3 * rows[1][1]  # -k 0: two sequences share a pass's 10 ms
    assert "most tokens/s here: 2 at once" in done.stdout


def test_serve_opens_the_slots_bench_streams_found_best(
    tmp_path: Path, fake_pair: FakePair
) -> None:
    """A bench large enough to remember keeps the count of streams that gave the most; the
    API's ``parallel=None`` (serve's default) then opens that many, and says so; ``parallel``
    given, or another pair's models, keep their own."""
    from specgen.api import Specgen

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The capital of France is\nList three colours:\nCount to ten:\nHello\n")
    name = fake_pair.named()
    assert Specgen(pair=name, from_bench=True, parallel=None).parallel == 1  # nothing measured
    done = specgen_here(
        "bench", "--pair", name, "-k", "2", "-n", "64", "--prompts", str(prompts),
        "--temperature", "0", "--streams", "1,2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "serve opens 2 slots here" in done.stderr
    picked = Specgen(pair=name, from_bench=True, parallel=None)
    assert picked.parallel == 2 and picked.pair.parallel == 2
    assert "--parallel 2: what `specgen bench --streams` found best here" in picked.note
    assert Specgen(pair=name, from_bench=True, parallel=1).parallel == 1
    # A batch without --parallel runs that many at once too, its results in the file's order.
    batch = specgen_here(
        "run", "--pair", name, "--each-line", "-f", str(prompts), "-n", "4", "--json",
        "--temperature", "0",
    )  # fmt: skip
    assert batch.returncode == 0, batch.stderr
    assert "--parallel 2: what `specgen bench --streams` found best here" in batch.stderr
    ids = [json.loads(line)["id"] for line in batch.stdout.splitlines()]
    assert ids == sorted(ids, key=int) and len(ids) == 4, ids
    other = Specgen(target=str(fake_pair.draft), draft=str(fake_pair.draft), parallel=None)
    assert other.parallel == 1


def test_bench_streams_says_where_the_target_alone_was_faster() -> None:
    """The count with the most tokens/s under ``-k auto`` is serve's; where ``-k 0`` measured
    more at that count (short answers at several streams on a CPU), the advice says so."""

    def rows(auto_two: float, plain_two: float) -> list[StreamsRow]:
        return [
            StreamsRow(1, "auto", 516, 10.0),
            StreamsRow(2, "auto", int(auto_two * 10), 10.0),
            StreamsRow(1, "0", 445, 10.0),
            StreamsRow(2, "0", int(plain_two * 10), 10.0),
        ]

    def advice(table: list[StreamsRow]) -> list[str]:
        return streams_advice(table, best_streams([r for r in table if r.lookahead == "auto"]))

    slower = advice(rows(61.4, 66.4))
    assert slower[0].startswith("most tokens/s here: 2 at once (61.4 tok/s)")
    assert len(slower) == 2 and "target alone was faster here (66.4 tok/s)" in slower[1]
    assert "serve --parallel 2 -k 0" in slower[1]
    faster = advice(rows(70.0, 66.4))
    assert len(faster) == 1 and "2 at once (70.0 tok/s)" in faster[0]
    assert len(advice(rows(40.0, 66.4))) == 1  # one stream is best: -k 0 lost there


def test_bench_streams_takes_counts_only() -> None:
    done = specgen_here("bench", "--streams", "0,2")
    assert done.returncode == 2 and "--streams takes counts from 1 to 64" in done.stderr
