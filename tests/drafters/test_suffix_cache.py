"""The suffix cache (prompt lookup across requests), on fakes: what it proposes, how it is
bounded, its file, and that its guesses keep the output exact (greedy identity, chi-square)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specgen.core.sampling import SamplingParams, warp
from specgen.drafters import NgramDrafter, SuffixCache
from specgen.drafters.suffix import KEY, _key, _keys
from specgen.engine import GenerationConfig, SpeculativeEngine
from tests.fakes import FakeModel, run_to_end
from tests.stats_helpers import pooled_chisquare_pvalue

GREEDY = SamplingParams(temperature=0)
SAMPLING = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


def test_a_lookup_s_key_is_the_index_s_key_of_the_same_window() -> None:
    """The key a cycle looks up (Python numbers) is the one the index was built with (numpy),
    for token ids up to a 262k vocabulary's."""
    rng = np.random.default_rng(5)
    doc = rng.integers(0, 262_144, 200).astype(np.int32)
    keys = _keys(doc)
    assert [_key(doc[i : i + KEY].tolist()) for i in range(len(keys))] == keys


def test_it_proposes_what_most_documents_went_on_with_after_the_longest_match() -> None:
    cache = SuffixCache()
    cache.add([9, 1, 2, 3, 4, 5, 6, 7])
    cache.add([8, 1, 2, 3, 4, 5, 6, 0])
    cache.add([7, 1, 2, 3, 4, 5, 6, 7])
    found = cache.candidate([1, 2, 3, 4])
    assert found is not None and found.source == "cache"
    # three documents back "5 6", two of three go on with 7
    assert found.preview == (5, 6, 7) and found.acceptance_key == "cache4+"
    # a longer match (10 tokens back) wins over more documents with a shorter one
    cache.add([11, 12, 13, 14, 15, 9, 1, 2, 3, 4, 10, 11, 12])
    longer = cache.candidate([11, 12, 13, 14, 15, 9, 1, 2, 3, 4])
    assert longer is not None and longer.preview == (10, 11, 12)
    assert longer.match_length == 10 and longer.acceptance_key == "cache8"
    # guesses not yet verified extend the text looked up
    assert cache.candidate([0, 1, 2], guesses=[3, 4]).preview == (5, 6, 7)
    assert cache.candidate([4, 3, 2, 1]) is None  # never seen


def test_a_match_of_the_whole_window_is_its_own_kind_of_evidence() -> None:
    cache = SuffixCache()
    doc = list(range(1, 121))
    cache.add(doc)
    resent = cache.candidate(doc[:80])  # 80 tokens back match: all the window looked up
    assert resent is not None and resent.acceptance_key == "cache64"
    assert resent.preview == tuple(doc[80:112]) and resent.match_length == 64
    part = cache.candidate([999, *doc[40:80]])  # 40 tokens match, then the text differs
    assert part is not None and part.acceptance_key == "cache32" and part.match_length == 40


def test_it_stays_within_its_bound_and_keeps_the_documents_that_were_of_use() -> None:
    cache = SuffixCache(max_tokens=100)
    docs = [[d, d, *range(100 * d, 100 * d + 20)] for d in range(8)]  # 22 tokens each
    for doc in docs[:4]:
        cache.add(doc)
    assert cache.tokens == 88 and len(cache) == 4
    assert cache.candidate(docs[0][:10]) is not None  # the oldest was of use just now
    cache.add(docs[4])  # over the bound: the least recently useful (docs[1]) goes
    assert cache.tokens <= 100
    assert cache.candidate(docs[0][:10]) is not None
    assert cache.candidate(docs[1][:10]) is None
    for doc in docs[5:]:
        cache.add(doc)
    assert cache.tokens <= 100 and len(cache) == 4


def test_a_chat_that_goes_on_replaces_the_turn_it_extends() -> None:
    cache = SuffixCache()
    turn = list(range(1, 12))
    cache.add(turn)
    cache.add([*turn, 12, 13, 14, 15])
    assert len(cache) == 1 and cache.tokens == 15
    assert cache.candidate(turn[:9]).acceptance_key == "cache8"  # one document, not two


def test_the_file_round_trip_and_files_it_will_not_read(tmp_path: Path) -> None:
    cache = SuffixCache(vocabulary="vocab-a")
    cache.add(list(range(1, 13)))
    cache.add([5, 5, 5, 5, 9])
    file = tmp_path / "lookups.bin"
    cache.save(file)
    again = SuffixCache(vocabulary="vocab-a")
    assert again.load(file) is None
    assert again.tokens == 17 and again.candidate(list(range(1, 10))).preview == (10, 11, 12)
    assert not again.changed  # nothing new to write back
    foreign = SuffixCache(vocabulary="vocab-b")
    said = foreign.load(file)
    assert said and "another model vocabulary" in said and foreign.tokens == 0
    for broken in (b"not a cache", file.read_bytes()[:-3]):
        file.write_bytes(broken)
        fresh = SuffixCache(vocabulary="vocab-a")
        said = fresh.load(file)
        assert said and "not a lookup cache specgen can read" in said and fresh.tokens == 0
    assert SuffixCache().load(tmp_path / "none-yet.bin") is None  # the first run: no file


def test_a_second_request_is_guessed_from_the_first_and_stays_the_target_alone() -> None:
    """Greedy: the same prompt twice; the second is guessed from the cache, token for token
    what the target alone writes, in fewer cycles."""
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    alone, _ = run_to_end(SpeculativeEngine(FakeModel()), GenerationConfig(0, GREEDY, 48), prompt)
    cache = SuffixCache()
    engine = SpeculativeEngine(FakeModel(), NgramDrafter(cache))
    first, first_stats = run_to_end(engine, GenerationConfig(4, GREEDY, 48), prompt)
    second, second_stats = run_to_end(engine, GenerationConfig(4, GREEDY, 48), prompt)
    assert first == second == alone
    assert "cache" not in first_stats.by_source
    assert second_stats.by_source["cache"].accepted > 30
    assert second_stats.n_cycles < first_stats.n_cycles / 2


@pytest.mark.parametrize("coupling", ["residual", "gumbel"])
@pytest.mark.parametrize("lookahead", [3, "auto"])
def test_cache_guesses_keep_the_target_distribution(lookahead, coupling) -> None:
    """Chi-square on (x2, x3) against sum over x1 of p(x1) p(x2 | x1) p(x3 | x1 x2): the cache
    holds, for every x, a document "0 1 ... 9 x y z" (y, z fixed per x), so whatever x1 is,
    the text ends in an 11-token match and the cache guesses (point masses) at both
    positions."""
    prompt = list(range(10))
    ref = FakeModel(sharpness=0.7)

    def p(context: list[int]) -> np.ndarray:
        return warp(ref.logits_after([*prompt, *context]), SAMPLING).dense(16)

    joint = sum(p([])[a] * np.array([p([a])[b] * p([a, b]) for b in range(16)]) for a in range(16))

    def cached() -> SuffixCache:  # each run sees these 16 documents only
        cache = SuffixCache()
        for x in range(16):
            cache.add([*prompt, x, (x * 5) % 16, (x * 3 + 1) % 16])
        return cache

    target = FakeModel(sharpness=0.7, call_seconds=0.010, token_seconds=0.001)
    counts, n, guessed = np.zeros((16, 16)), 3000, 0
    drafter = NgramDrafter()
    engine = SpeculativeEngine(target, drafter, clock=target.clock)  # auto learns as it goes
    for seed in range(n):
        drafter.cache = cached()
        config = GenerationConfig(lookahead, SAMPLING, 4, seed=seed, coupling=coupling)
        tokens, stats = run_to_end(engine, config, prompt)
        counts[tokens[1], tokens[2]] += 1
        guessed += stats.by_source["cache"].drafted if "cache" in stats.by_source else 0
    # cache guesses at both positions in every run at K=3; auto weighs them (they seldom
    # survive here) and still makes some
    assert guessed >= (2 * n if lookahead == 3 else n / 30)
    assert pooled_chisquare_pvalue(counts, joint * n) > 1e-3


def test_two_vocabularies_never_share_a_cache(tmp_path: Path, fake_pair, monkeypatch) -> None:
    from specgen.session.pair import PairOptions, load_pair, vocabulary_tag
    from tests.fakes import write_fake

    small, large = FakeModel(n_vocab=16), FakeModel(n_vocab=32)
    assert vocabulary_tag(small) != vocabulary_tag(large)
    file = tmp_path / "lookups.bin"
    options = PairOptions(lookup_file=file)
    first = load_pair(fake_pair.target, fake_pair.draft, options, ngram=True)
    assert first.lookup is not None and first.notes == []
    first.lookup.add(list(range(10)))
    first.remember_costs()  # writes the cache
    assert file.is_file()
    other = write_fake(tmp_path / "other.gguf", n_vocab=32)
    second = load_pair(other, None, options, ngram=True)
    assert second.lookup is not None and second.lookup.tokens == 0
    assert any("another model vocabulary" in note for note in second.notes)
    second.lookup.add(list(range(12)))
    second.remember_costs()  # never overwrites what it could not read
    same = load_pair(fake_pair.target, fake_pair.draft, options, ngram=True)
    assert same.lookup is not None and same.lookup.tokens == 10
    off = load_pair(fake_pair.target, None, PairOptions(lookup_cache=False), ngram=True)
    assert off.lookup is None


def test_short_matches_need_several_documents_behind_them() -> None:
    cache = SuffixCache()
    cache.add([1, 2, 3, 4, 5, 6])
    assert cache.candidate([0, 2, 3, 4]) is None  # 3 tokens match: the text's own n-grams' job
    assert cache.candidate([1, 2, 3, 4]) is None  # one document, 4 tokens: too little evidence
    cache.add([9, 1, 2, 3, 4, 5, 7])
    assert cache.candidate([1, 2, 3, 4]).acceptance_key == f"cache{KEY}+"  # two documents
