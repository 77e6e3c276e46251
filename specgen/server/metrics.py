"""The server's Prometheus metrics, named as vLLM and llama.cpp's server name theirs."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from specgen.engine.streams import BatchStats
from specgen.stats import Stats


class Metrics:
    """Counters named as vLLM and llama.cpp's server name theirs, in one registry per app."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.drafts = Counter(
            "specgen_spec_decode_num_drafts", "Cycles that verified guesses", registry=r
        )
        self.draft_tokens = Counter(
            "specgen_spec_decode_num_draft_tokens", "Guesses drafted", registry=r
        )
        self.accepted_tokens = Counter(
            "specgen_spec_decode_num_accepted_tokens", "Guesses the target accepted", registry=r
        )
        self.accepted_per_pos = Counter(
            "specgen_spec_decode_num_accepted_tokens_per_pos",
            "Guesses accepted at each position of a cycle",
            ["position"],
            registry=r,
        )
        self.by_source = Counter(
            "specgen_draft_tokens_by_source",
            "Guesses by where they came from (model, ngram: the request's own text, cache: "
            "earlier requests, grammar: forced) and whether the target accepted them",
            ["source", "verdict"],
            registry=r,
        )
        self.prompt_tokens = Counter("specgen_prompt_tokens", "Prompt tokens", registry=r)
        self.prompt_tokens_cached = Counter(
            "specgen_prompt_tokens_cached", "Prompt tokens reused from the cache", registry=r
        )
        self.generation_tokens = Counter(
            "specgen_generation_tokens", "Generated tokens", registry=r
        )
        self.requests = Counter(
            "specgen_requests",
            "Requests by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "specgen_request_latency_seconds", "Time to serve a request", ["endpoint"], registry=r
        )
        self.tokens_per_second = Gauge(
            "specgen_predicted_tokens_seconds",
            "Generation speed of the last request (tokens/s)",
            registry=r,
        )
        self.queue = Gauge("specgen_requests_waiting", "Requests waiting for the model", registry=r)
        self.slots_busy = Gauge("specgen_slots_busy", "Requests generating now", registry=r)
        self.passes = Gauge(
            "specgen_batch_target_passes",
            "Target passes so far, by the sequences each verified at once",
            ["sequences"],
            registry=r,
        )
        self.lookahead = Gauge(
            "specgen_batch_mean_lookahead",
            "Mean guesses per sequence in a target pass, by the sequences in it (-k auto "
            "prices K by the whole batch)",
            ["sequences"],
            registry=r,
        )

    def batches(self, stats: BatchStats) -> None:
        """What the slots' scheduler did so far (read at each scrape)."""
        guesses = dict(stats.guesses)  # copies: the slots' thread goes on counting
        for size, passes in dict(stats.sequences).items():
            self.passes.labels(sequences=str(size)).set(passes)
            mean = guesses.get(size, 0) / (passes * size)
            self.lookahead.labels(sequences=str(size)).set(mean)

    def record(self, stats: Stats) -> None:
        self.drafts.inc(_drafting_cycles(stats))
        self.draft_tokens.inc(stats.n_drafted)
        self.accepted_tokens.inc(stats.n_accepted)
        for name, source in stats.by_source.items():
            self.by_source.labels(source=name, verdict="drafted").inc(source.drafted)
            self.by_source.labels(source=name, verdict="accepted").inc(source.accepted)
        for position, accepted in enumerate(stats.accepted_at):
            self.accepted_per_pos.labels(position=str(position)).inc(accepted)
        self.prompt_tokens.inc(stats.n_prompt)
        self.prompt_tokens_cached.inc(stats.n_prompt_cached)
        self.generation_tokens.inc(stats.n_generated)
        if stats.tokens_per_second:
            self.tokens_per_second.set(stats.tokens_per_second)


def _drafting_cycles(stats: Stats) -> int:
    return sum(source.cycles for source in stats.by_source.values())
