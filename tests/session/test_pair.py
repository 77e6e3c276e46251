"""Deciding what a command runs and loading it, on fake models: the one decision (models, K,
drafting, what bench found), the vocabulary check, and the costs `-k auto` keeps between
processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specgen.core.sampling import SamplingParams
from specgen.drafters import TARGET_ALONE
from specgen.engine import GenerationConfig
from specgen.errors import UsageError, UserError
from specgen.lookahead import AdaptiveLookahead, PairProfile
from specgen.session.generate import stream
from specgen.session.pair import PairOptions, load_pair
from tests.conftest import FakePair
from tests.fakes import write_fake

GREEDY = SamplingParams(temperature=0)
OPTIONS = PairOptions(n_ctx=256, target_threads=2, draft_threads=2)


def test_auto_remembers_its_costs_for_the_next_process(fake_pair: FakePair) -> None:
    """What `-k auto` measured is kept per model files, machine and threads, greedy and sampled
    apart: the next load starts from it (no timing cycles), a sampled run learns its own costs
    and leaves the greedy ones alone, other threads start afresh, a broken file is ignored."""
    first = load_pair(fake_pair.target, fake_pair.draft, OPTIONS)
    assert first.costs_file is not None and not first.costs_file.exists()
    config = GenerationConfig(lookahead="auto", sampling=GREEDY, max_tokens=32)
    *_, result = stream(first, "The history of the Roman Empire", config)
    assert result.stats.k_counts.get(0, 0) >= 2  # nothing known: the target alone is timed
    assert first.costs_file.exists()
    learned = first.costs.snapshot()
    assert learned["greedy"]["verify_by_n"]["1"] == pytest.approx(0.011)  # the fake clock's
    assert learned["greedy"]["per_guess"]["model"] == pytest.approx(0.002)
    assert not learned["sampled"]["verify_by_n"]  # a sampled run has its own costs

    again = load_pair(fake_pair.target, fake_pair.draft, OPTIONS)
    assert again.costs_file == first.costs_file
    assert again.costs.snapshot() == learned  # JSON keeps floats exact
    # Trusted at once (whether drafting pays is then the policy's call on these figures, tested
    # on fakes): no timing of the target or the draft, unlike a fresh start.
    assert again.engine().costs is again.costs
    greedy = again.costs.greedy
    assert greedy.verify_by_n[1].count >= 2 and greedy.guess_timed("model")
    candidates = again.drafter().candidates([1, 2, 3])
    assert AdaptiveLookahead(PairProfile()).plan(candidates, 100) == TARGET_ALONE
    *_, result = stream(again, "The history of the Roman Empire", config)
    assert result.stats.k_counts.get(0, 0) < 2  # drafts from its first cycle

    sampled = GenerationConfig(
        lookahead="auto", sampling=SamplingParams(temperature=0.8), max_tokens=16, seed=1
    )
    *_, result = stream(again, "The history of the Roman Empire", sampled)
    assert result.stats.k_counts.get(0, 0) >= 2  # sampled costs are timed afresh
    kept = load_pair(fake_pair.target, fake_pair.draft, OPTIONS).costs.snapshot()
    assert kept["greedy"]["verify_by_n"] == again.costs.snapshot()["greedy"]["verify_by_n"]
    assert "1" in kept["sampled"]["verify_by_n"]

    other = load_pair(
        fake_pair.target, fake_pair.draft, PairOptions(n_ctx=256, target_threads=1, draft_threads=1)
    )
    assert other.costs_file != first.costs_file and not other.costs.observations
    assert not other.costs.greedy.verify_by_n

    first.costs_file.write_text("{not json")
    assert not load_pair(fake_pair.target, fake_pair.draft, OPTIONS).costs.greedy.verify_by_n
    first.costs_file.write_text(json.dumps({"verify_by_n": {"1": 0.01}}))  # before the modes
    assert not load_pair(fake_pair.target, fake_pair.draft, OPTIONS).costs.greedy.verify_by_n


def test_a_draft_that_does_not_fit_is_refused_and_a_fit_is_checked_once(
    fake_pair: FakePair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specgen.models import compat

    wide = write_fake(tmp_path / "wide.gguf", n_vocab=300)  # sizes 284 apart: llama.cpp's rule
    with pytest.raises(
        UserError, match="cannot serve target target.gguf: vocabulary sizes differ by 284"
    ):
        load_pair(fake_pair.target, wide, OPTIONS)
    load_pair(fake_pair.target, fake_pair.draft, OPTIONS)
    checked = []
    monkeypatch.setattr(compat, "check", lambda t, d: checked.append(1))
    load_pair(fake_pair.target, fake_pair.draft, OPTIONS)
    assert checked == []  # the stamp of the first check stands for these two files


def test_one_decision_for_models_k_and_drafting(fake_pair: FakePair) -> None:
    from specgen.session.decide import ALONE_NOTE, decide

    name = fake_pair.named()
    pair = decide(name)
    assert pair.lookahead == "auto" and pair.ngram and pair.draft is not None
    assert pair.name == name and pair.note == ""
    assert decide(name, ngram=False).ngram is False
    by_ngram = decide(name, draft="ngram")
    assert by_ngram.draft is None and by_ngram.ngram and by_ngram.lookahead == "auto"
    fixed = decide(name, lookahead=0)  # the target alone: no draft to load, no lookup
    assert fixed.draft is None and not fixed.ngram
    # Own files draft by prompt lookup too (with the cache across requests) unless told not
    # to, or unless bench found it loses (test_what_bench_found_...).
    own = decide(target=str(fake_pair.target), draft=str(fake_pair.draft))
    assert own.ngram and own.draft is not None
    lookup = decide(target=str(fake_pair.target), lookahead=4, explain_alone=True)
    assert lookup.lookahead == 4 and lookup.ngram and lookup.draft is None and lookup.note == ""
    alone = decide(target=str(fake_pair.target), lookahead=4, ngram=False, explain_alone=True)
    assert alone.lookahead == 0 and alone.note == ALONE_NOTE
    assert decide(target=str(fake_pair.target), lookahead=4, ngram=False).note == ""
    with pytest.raises(UsageError, match="--draft needs a target"):
        decide(draft=str(fake_pair.draft))


def test_what_bench_found_is_the_k_unless_the_command_says_otherwise(fake_pair: FakePair) -> None:
    from specgen.session.decide import decide
    from specgen.session.memo import MEMO_VERSION

    name = fake_pair.named()
    memo = decide(name).memo
    memo.parent.mkdir(parents=True, exist_ok=True)
    memo.write_text(
        json.dumps(
            {
                "schema": MEMO_VERSION,
                "greedy": {
                    "variant": "ngram",
                    "speedup": 2.5,
                    "temperature": 0.0,
                    "date": "2026-11-30",
                },
                "sampled": {"variant": 3, "speedup": 1.3, "temperature": 0.8, "date": "2026-11-29"},
            }
        )
    )
    greedy = decide(name, bench_temperature=0.0)
    assert greedy.lookahead == "auto" and greedy.draft is None and greedy.ngram
    assert greedy.note.startswith(
        "ngram: what `specgen bench` found best here (2026-11-30, 2.50x at T=0.0)"
    )
    sampled = decide(name, bench_temperature=0.8)
    assert sampled.lookahead == 3 and not sampled.ngram and sampled.draft is not None
    for said in ({"lookahead": 5}, {"ngram": True}, {"draft": "ngram"}):
        assert decide(name, bench_temperature=0.8, **said).note == ""  # the command says how
    assert decide(name).lookahead == "auto"  # bench not asked (the API by default)
    memo.write_text(json.dumps({"schema": MEMO_VERSION, "sampled": {"variant": 99}}))  # no K
    assert decide(name, bench_temperature=0.8).note == ""
