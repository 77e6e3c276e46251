"""What a person sees: the statistics line, and which live view a terminal gets."""

from __future__ import annotations

import io
import os
import re
import sys
import threading

from specgen.cli.live import stats_text
from specgen.stats import SourceStats, Stats
from tests.conftest import FakePair


def test_one_cycle_is_singular() -> None:
    stats = Stats(lookahead=0, seed=1, speculative=False)
    stats.n_cycles, stats.n_generated = 1, 1
    text = stats_text(stats).plain
    assert "1 cycle" in text and "1 cycles" not in text and "1 token " in text + " "


def test_final_stats_fit_80_columns() -> None:
    stats = Stats(
        lookahead="auto",
        seed=4294967295,
        n_prompt=1234,
        prompt_seconds=0.5,
        n_generated=1000,
        n_cycles=333,
        n_drafted=2222,
        n_accepted=1111,
        current_lookahead=12,
        stop_reason="max_tokens",
    )
    stats.by_source = {"model": SourceStats(100, 2000, 1000), "ngram": SourceStats(20, 222, 111)}
    wide = stats_text(stats, final=True).plain
    assert len(wide) > 80  # the whole story is long...
    lines = stats_text(stats, final=True, width=80).plain.splitlines()
    assert len(lines) >= 2 and all(len(line) <= 80 for line in lines)  # ...and fits
    assert " ".join(lines).split() == wide.split()  # nothing lost, nothing split mid-word


def test_acceptance_is_per_source_and_each_count_has_one_name() -> None:
    """A draft model at 89% beside prompt lookup at 12% reads as both, not as a mixed 40%;
    the counts are "accepted" for one source or several; a run whose last cycle chose no
    guess (a run's end often does) is not called off."""
    stats = Stats(lookahead="auto", seed=1, n_cycles=30, n_generated=100, n_drafted=71)
    stats.n_accepted = 44
    stats.by_source = {"model": SourceStats(10, 46, 41), "ngram": SourceStats(5, 25, 3)}
    stats.k_counts, stats.current_lookahead = {0: 2, 4: 20, 6: 8}, 0
    final = stats_text(stats, final=True).plain
    assert "accept model 89% ngram 12%" in final and "62%" not in final
    assert "accepted model 41/46 ngram 3/25" in final
    assert "K=auto (mostly 4)" in final and "off" not in final
    assert "K=auto (now 0)" in stats_text(stats).plain  # live: the cycle's own K
    stats.by_source = {"model": SourceStats(10, 46, 41)}
    stats.n_drafted, stats.n_accepted = 46, 41
    one = stats_text(stats, final=True).plain
    assert "accept 89%" in one and "accepted model 41/46" in one


def test_a_terminal_that_reports_no_size_gets_no_bar(fake_pair: FakePair) -> None:
    """stdout and stderr on one pseudo-terminal of 0x0 (what `script`, some CI runners and
    `docker exec -t` give): there is no bottom row to keep a bar on, so no scroll region is
    set; the text streams and the final statistics follow it."""
    import pty

    from specgen import cli

    master, slave = pty.openpty()  # a new pseudo-terminal has no size until one is set
    assert os.get_terminal_size(slave) == os.terminal_size((0, 0))
    screen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                return
            if not chunk:
                return
            screen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    saved = sys.stdout, sys.stderr
    tty = io.TextIOWrapper(io.FileIO(slave, "w", closefd=False), write_through=True)
    sys.stdout = sys.stderr = tty
    try:
        code = cli.execute(
            [
                "run",
                "Tell me about the moon.",
                *fake_pair.args("--temperature", "0", "-n", "40", "-k", "4"),
            ]
        )
    finally:
        tty.flush()
        sys.stdout, sys.stderr = saved
        os.close(slave)
        reader.join(10)
        os.close(master)
    assert code == 0
    assert not re.search(rb"\x1b\[1;\d+r", screen) and b"\x1b[r" not in screen  # no region
    text, _, stats = bytes(screen).rpartition(b"K=4")
    assert text.strip() and b"tok/s" in stats and b"stop: max_tokens" in stats
