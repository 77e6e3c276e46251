"""The whole HTTP API fuzzed with schemathesis against the server's own OpenAPI schema, in this
process on fake models (httpx's ASGI transport, no socket): whatever a client sends, no 500,
and every error is an OpenAI-style object. Bounded in examples, so it takes seconds."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

EXAMPLES = 40  # per operation


def test_no_request_gets_a_500_and_every_error_is_an_openai_error(fake_pair) -> None:
    from specgen.api import Specgen
    from specgen.server import create_app

    app = create_app(Specgen(target=fake_pair.target, draft=fake_pair.draft), max_queue=4)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/completions"}
    seen: dict[int, int] = {}

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case) -> None:
            if isinstance(case.body, dict):
                # A fake's context is 512 tokens: a huge max_tokens just runs until it is full.
                case.body.setdefault("max_tokens", 8)
            response = case.call()
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            assert response.status_code < 500, (response.status_code, response.text[:300])
            if response.status_code >= 400:
                error = response.json().get("error")
                assert isinstance(error, dict) and error.get("message") and error.get("type")

        check()
    assert any(code < 300 for code in seen) and any(code >= 400 for code in seen), seen


@pytest.mark.parametrize("repeat", [5e-324, 1e-40, 1e300])
def test_what_the_fuzzer_found_is_answered(fake_pair, repeat: float) -> None:
    """The kind of request the fuzzer once turned into a 500 (repeat_penalty 5e-324), where the
    draft guesses every cycle: a positive penalty so extreme that a logit scaled by it leaves
    float32 still gives text, greedy and sampled."""
    from specgen.api import Specgen

    api = Specgen(target=fake_pair.target, draft=fake_pair.draft, lookahead=4)
    for temperature in (0.0, 0.7, 1.0):
        result = api.generate(
            "CycleDone", repeat_penalty=repeat, temperature=temperature, max_tokens=16, seed=3
        )
        assert result.stats.n_generated > 0 and result.stats.n_drafted > 0
