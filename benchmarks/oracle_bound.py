"""What any choice of guesses could reach on ``concurrency.py``'s workload (sampled: on the
seeds ``server_duel.py --new-seeds`` sends): a bound that knows every text in advance (issue 36).

``batch_bound.py`` bounds a batch by an acceptance rate alpha; a workload whose texts repeat
(prompt lookup's runs of 10-30 tokens on a base model's answers) is not one alpha, and a figure
above an alpha's bound proves nothing. Greedy, the texts are fixed: the target's own output.
Sampled (``--temperature``), they are the target's Gumbel-max samples on each request's seed,
which is what specgen serves a seeded request at any K (``core.coupling``); ``--sets`` works out
that many sets of requests, set s with request i's seed 1000 s + i, as ``server_duel.py
--new-seeds`` gives its round s. So this works out, for every position x of every request's
text, the longest run of its next tokens that a guess could have got right there:

- prompt lookup, at its most: any earlier place where the text's last token occurred, in the
  request's prompt and text so far and, but for the first wave of requests (0 .. C-1 at C
  clients, which start with the suffix cache empty), in the prompts and whole texts of every
  other request (what the suffix cache across requests could hold at most), read on as far
  as it agrees with the text (at most ``NGRAM_SPAN`` tokens); a guess of one token is kept iff
  it is the text's, under either sampling rule;
- the draft model's own guesses from there, as far as they are kept: greedy, its argmax;
  sampled, its Gumbel-max pick under the text's noise (``either``) and, separately, a coin
  with min(1, q/p) given the text's token (``either_coin``: the min(1, p/q) rule's, whose
  coins keep at every position at least the Gumbel-max rule's chance: ``draft_right``);
- any chain of the two (one's run, then the other's from where it ends), at most
  ``AUTO_MAX_LOOKAHEAD`` guesses a cycle;
- and beside hindsight's prompt lookup, specgen's own (``ngram``, ``ngram_either``): the run
  its ``NgramDrafter`` keeps at each position, a function of the text so far (in the middle
  of a cycle specgen looks up the text so far and its guesses with the index of the text
  alone, which can find another match: ``ngram_either`` reads every position as a cycle's
  start, so it bounds specgen's chains only nearly).

A cycle keeps at most such a run and the target's token after it, so a request needs at least
the fewest cycles those runs allow with d of the draft's guesses (a shortest path over its
positions, for every d), and a client that sends its requests one after another at least the
sum of its requests' cycles: a pass each. A pass over n tokens costs at least phi(n), the convex
lower hull of the target's passes timed here (S sequences of L tokens, every row read, as
``batch_bound.py`` times them); P passes that verify the workload's tokens and read its
prompts cost at least P * phi(tokens / P) (phi convex and rising), the least over every P from
the busiest client's cycles up; and a draft guess costs at least its share of the draft's
cheapest step per sequence (steps over at most C sequences). No host, scheduling, network or
draft catch-up time: a figure above this bound cannot be reached by any choice of K or source
(sampled: on those texts, and under the coin's rule in expectation over its coins).

    python benchmarks/oracle_bound.py TARGET DRAFT --clients 1,2,4 [-n 128] [--json out.json]
    python benchmarks/oracle_bound.py TARGET DRAFT --clients 4 --temperature 0.8 --sets 6
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from batch_bound import timed_pass  # noqa: E402
from concurrency import PROMPTS, SAMPLING, prompt_text  # noqa: E402

from specgen.backend import LlamaModel, ModelOptions  # noqa: E402
from specgen.core.coupling import gumbel_pick  # noqa: E402
from specgen.core.sampling import Dist, SamplingParams, warp  # noqa: E402
from specgen.drafters.ngram import NGRAM_SPAN, NgramDrafter  # noqa: E402
from specgen.lookahead.adaptive import AUTO_MAX_LOOKAHEAD  # noqa: E402

# Draft guesses no schedule needs: a cycle count that no number of guesses reaches.
UNREACHABLE = 10**9


def greedy_text(model: LlamaModel, prompt: list[int], max_tokens: int) -> list[int]:
    """The target's own greedy answer to ``prompt``, to its end of generation or max_tokens."""
    sequence = model.sequence(0)
    sequence.reset()
    row = sequence.decode(prompt, 1)[-1]
    text: list[int] = []
    while len(text) < max_tokens:
        token = int(np.argmax(row))
        if model.is_eog(token):
            break
        text.append(token)
        row = sequence.decode([token], 1)[-1]
    return text


class Sampled(NamedTuple):
    """A sampled text's making: its seed, the warp, and the target's p at each of its tokens."""

    seed: int
    params: SamplingParams
    p: list[Dist]


def sampled_text(
    model: LlamaModel, prompt: list[int], max_tokens: int, params: SamplingParams, seed: int
) -> tuple[list[int], Sampled]:
    """The target's sampled answer under the Gumbel-max rule with ``seed``: specgen's own text
    for a request with that seed, at any K (up to a float at a near tie)."""
    sequence = model.sequence(0)
    sequence.reset()
    row = sequence.decode(prompt, 1)[-1]
    text: list[int] = []
    made = Sampled(seed, params, [])
    while len(text) < max_tokens:
        p = warp(row, params)
        token = gumbel_pick(p, seed, len(text))
        if model.is_eog(token):
            break
        text.append(token)
        made.p.append(p)
        row = sequence.decode([token], 1)[-1]
    return text, made


def runs_of(right: list[bool], cap: int) -> list[int]:
    """At every position, how many guesses from there in a row are right (at most ``cap``)."""
    runs = [0] * (len(right) + 1)
    for y in range(len(right) - 1, -1, -1):
        runs[y] = runs[y + 1] + 1 if right[y] else 0
    return [min(cap, r) for r in runs[: len(right)]]


def draft_right(
    model: LlamaModel,
    prompt: list[int],
    text: list[int],
    sampled: Sampled | None = None,
) -> dict[str, list[bool]]:
    """At every position y of ``text``, whether the draft model's guess there is kept, by rule.
    While its guesses are kept, the draft has read the text's own tokens, so its guess at y is
    drawn from its row after ``text[:y]``: one pass over the whole text gives every position's.

    Greedy: its argmax equals the text's token. Sampled (``sampled``, the target's p at every
    position and the text's seed), with q its row warped as specgen warps a draft's:
    ``draft``, its Gumbel-max pick under the text's own noise equals the token (the rule a
    seeded request runs, ``core.coupling``); ``coin``, a coin kept with probability
    min(1, q(t) / p(t)) given the token t, one draw from a generator on the seed. Under the
    min(1, p/q) rule a guess is kept and the token is t with probability min(p(t), q(t)), so
    the coin's is its chance given t, and given the text each position's coin is its own.
    Under the Gumbel-max rule both picks are t with probability
    1 / sum_y max(p(y)/p(t), q(y)/q(t)) <= min(p(t), q(t)), each position's noise its own: given
    the text, every position keeps with no more chance than the coin's, independently, so the
    coins bound that rule's runs too, in expectation (one draw a set: the mean over sets
    estimates it). A drafter that reads less of what it missed (``CATCH_UP_WINDOW``) has
    another q; the row here has read the whole text."""
    sequence = model.sequence(0)
    sequence.reset()
    rows = sequence.decode(prompt + text, len(text) + 1)
    if sampled is None:
        return {"draft": [int(np.argmax(rows[y])) == t for y, t in enumerate(text)]}
    coins = np.random.default_rng(sampled.seed)
    picked, coin = [], []
    for y, token in enumerate(text):
        q = warp(rows[y], sampled.params)
        picked.append(gumbel_pick(q, sampled.seed, y) == token)
        p = sampled.p[y].prob(token)  # > 0: the text's token was picked from p
        coin.append(bool(coins.random() < min(1.0, q.prob(token) / p)))
    return {"draft": picked, "coin": coin}


def agree(source: list[int], start: int, text: list[int], x: int, cap: int) -> int:
    """How many tokens of ``source[start:]`` agree with ``text[x:]`` (at most ``cap``)."""
    n = 0
    while n < cap and start + n < len(source) and x + n < len(text):
        if source[start + n] != text[x + n]:
            break
        n += 1
    return n


def lookup_runs(prompt: list[int], text: list[int], others: list[list[int]], cap: int) -> list[int]:
    """At every position x of ``text``, the longest run any prompt lookup could guess right:
    an earlier place where the last token occurred, read on (see the module's text). In the
    text's own context what follows such a place is read on as the text went on after it, and
    past the text's end as if it repeated with that period (as ``NgramDrafter`` guesses)."""
    runs = []
    for x in range(len(text)):
        context = prompt + text[:x]
        last = context[-1]
        best = 0
        for j in range(len(context) - 1):
            if context[j] != last:
                continue
            period, n = len(context) - 1 - j, 0
            while n < cap and x + n < len(text) and context[j + 1 + n % period] == text[x + n]:
                n += 1
            best = max(best, n)
        for other in others:
            for j, token in enumerate(other):
                if token == last:
                    best = max(best, agree(other, j + 1, text, x, cap))
        runs.append(best)
    return runs


def ngram_runs(prompt: list[int], text: list[int], cap: int) -> list[int]:
    """At every position x of ``text``, how far specgen's own prompt lookup guesses right there
    (``NgramDrafter``'s one candidate on the prompt and the text so far; no suffix cache): its
    guess is a function of the text so far, so this is the run it keeps, where hindsight
    (``lookup_runs``) may pick any earlier place."""
    drafter = NgramDrafter()
    drafter.begin(prompt)
    runs = []
    for x in range(len(text)):
        found = drafter.candidates(prompt + text[:x])
        runs.append(agree(list(found[0].preview), 0, text, x, cap) if found else 0)
    return runs


def cycles_by_draft(lookup: list[int], draft: list[int], cap: int) -> np.ndarray:
    """The fewest cycles that produce the whole text with at most d of the draft model's
    guesses in all, for every d from 0 to its length. A cycle from x verifies guesses up to
    some y and keeps the target's token after them: x..y-1 covered by runs of either source
    one after another (prompt lookup's free, each of the draft's a guess), at most ``cap``."""
    n = len(lookup)
    never = n + 1  # more cycles than any text needs: out of reach
    best = np.zeros((n + 1, n + 1), dtype=np.int64)  # best[x][d]
    for x in range(n - 1, -1, -1):
        last = min(n, x + cap)
        spent = [0] + [never] * (last - x)  # draft guesses to cover x..x+i-1
        for i in range(last - x):
            if spent[i] >= never:
                continue
            z = x + i
            for j in range(1, min(lookup[z], last - z) + 1):
                spent[i + j] = min(spent[i + j], spent[i])
            for j in range(1, min(draft[z], last - z) + 1):
                spent[i + j] = min(spent[i + j], spent[i] + j)
        row = np.full(n + 1, never, dtype=np.int64)
        for i, cost in enumerate(spent):
            if cost >= never:
                continue
            after = best[min(n, x + i + 1)]
            row[cost:] = np.minimum(row[cost:], after[: n + 1 - cost])
        best[x] = 1 + row
    return np.minimum.accumulate(best[0])


def draft_for_cycles(by_draft: np.ndarray, most: int) -> np.ndarray:
    """The fewest draft guesses that produce a text in at most P cycles, for P = 0..``most``
    (a large number where none can)."""
    out = np.full(most + 1, UNREACHABLE, dtype=np.int64)
    for d in range(len(by_draft) - 1, -1, -1):  # the least d reaching each cycle count
        cycles = int(by_draft[d])
        if cycles <= most:
            out[cycles] = d
    return np.minimum.accumulate(out)


def min_plus(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """c[P] = min over P1 + P2 = P of a[P1] + b[P2]: two texts one after another in P cycles."""
    out = np.full(len(a), UNREACHABLE, dtype=np.int64)
    for p1 in range(len(a)):
        out[p1:] = np.minimum(out[p1:], a[p1] + b[: len(a) - p1])
    return out


def lower_hull(points: dict[int, float]) -> list[tuple[int, float]]:
    """The convex lower hull of (tokens, seconds) points, left to right."""
    hull: list[tuple[int, float]] = []
    for p in sorted(points.items()):
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (y2 - y1) * (p[0] - x1) >= (p[1] - y1) * (x2 - x1):  # hull[-1] not below
                hull.pop()
            else:
                break
        hull.append(p)
    return hull


def phi(hull: list[tuple[int, float]], n: float) -> float:
    """The hull at ``n`` tokens (its first or last segment's line past its ends)."""
    if len(hull) == 1:
        return hull[0][1]
    for (x1, y1), (x2, y2) in zip(hull, hull[1:], strict=False):
        if n <= x2 or (x2, y2) == hull[-1]:
            return y1 + (y2 - y1) * (n - x1) / (x2 - x1)
    raise AssertionError("unreachable")


def bound(
    by_draft: list[np.ndarray],
    clients: int,
    hull: list[tuple[int, float]],
    per_guess: float,
    prompts: int,
) -> tuple[float, int, int]:
    """The least seconds of the workload at ``clients`` (client c sends requests c, c +
    clients, ...), the passes and the draft guesses of that least: at least P passes, P the
    cycles of the client with most, that verify every generated token and read the
    ``prompts``' tokens but each prompt's last (the first cycle's pass), and every draft
    guess ``per_guess`` seconds."""
    most = sum(len(b) - 1 for b in by_draft)
    tokens = most + prompts
    need = np.zeros(most + 1, dtype=np.int64)  # draft guesses in all for every client in P
    for first in range(clients):
        mine = [draft_for_cycles(by_draft[i], most) for i in range(first, len(by_draft), clients)]
        total = mine[0]
        for other in mine[1:]:
            total = min_plus(total, other)
        need = need + total
    passes = [p * phi(hull, tokens / p) if p else float("inf") for p in range(most + 1)]
    from_here = list(passes)
    for p in range(most - 1, -1, -1):  # at least P passes: any number from P up
        from_here[p] = min(from_here[p], from_here[p + 1])
    best = (float("inf"), 0, 0)
    for p in range(1, most + 1):
        if need[p] >= UNREACHABLE:
            continue
        seconds = from_here[p] + per_guess * int(need[p])
        if seconds < best[0]:
            best = (seconds, p, int(need[p]))
    return best


def workload_runs(
    target: LlamaModel,
    draft: LlamaModel,
    prompts: list[list[int]],
    max_tokens: int,
    params: SamplingParams | None,
    seeds: int,
) -> tuple[list[list[int]], list[dict[str, np.ndarray]]]:
    """The workload's texts (greedy, or sampled with request i's seed ``seeds + i``, as
    ``concurrency.body`` sends it) and, by request, the fewest cycles for every count of the
    draft's guesses: by source, and with every other text in the suffix cache or (``_first``)
    with none (a request of the first wave, which starts with the cache empty: requests 0 ..
    C-1 at C clients)."""
    cap = AUTO_MAX_LOOKAHEAD
    made: list[Sampled | None] = []
    texts = []
    for i, prompt in enumerate(prompts):
        if params is None:
            texts.append(greedy_text(target, prompt, max_tokens))
            made.append(None)
        else:
            text, sampled = sampled_text(target, prompt, max_tokens, params, seeds + i)
            texts.append(text)
            made.append(sampled)
    whole = [p + t for p, t in zip(prompts, texts, strict=True)]
    runs: list[dict[str, np.ndarray]] = []
    for i, (prompt, text) in enumerate(zip(prompts, texts, strict=True)):
        others = [w for j, w in enumerate(whole) if j != i]
        shared = lookup_runs(prompt, text, others, min(cap, NGRAM_SPAN))
        own = lookup_runs(prompt, text, [], min(cap, NGRAM_SPAN))
        right = {k: runs_of(v, cap) for k, v in draft_right(draft, prompt, text, made[i]).items()}
        none = [0] * len(text)
        found = {
            "plain": cycles_by_draft(none, none, cap),
            "lookup": cycles_by_draft(shared, none, cap),
            "lookup_first": cycles_by_draft(own, none, cap),
        }
        ngram = ngram_runs(prompt, text, min(cap, NGRAM_SPAN))
        found["ngram"] = cycles_by_draft(ngram, none, cap)
        for rule, model in right.items():
            name = "either" if rule == "draft" else f"either_{rule}"
            found[name] = cycles_by_draft(shared, model, cap)
            found[f"{name}_first"] = cycles_by_draft(own, model, cap)
            found[f"ngram_{name}"] = cycles_by_draft(ngram, model, cap)
        runs.append(found)
        print(
            f"request {i}: {len(text)} tokens; fewest cycles: prompt lookup {found['lookup'][0]}"
            f" ({found['lookup_first'][0]} on its own text), with the draft's guesses free "
            f"{found['either'][-1]}; right runs a position (mean): the draft model's "
            + ", ".join(
                f"{statistics.mean(v or [0]):.1f}" + ("" if k == "draft" else f" ({k})")
                for k, v in right.items()
            )
            + f", lookup {statistics.mean(shared or [0]):.1f} ({statistics.mean(own or [0]):.1f}"
            f", specgen's {statistics.mean(ngram or [0]):.1f})",
            file=sys.stderr,
        )
    return texts, runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("draft")
    parser.add_argument("--clients", default="1,2,4")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="as concurrency.py's")
    parser.add_argument(
        "--sets", type=int, default=1, help="sampled: sets of requests, seeds 1000 s + i"
    )
    parser.add_argument("--lengths", default="1,2,3,5,9,17,33", help="tokens a sequence, timed")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    streams = max(clients)
    options = ModelOptions(n_ctx=4096, n_threads=args.threads, n_seq=streams)
    target, draft = LlamaModel(args.target, options), LlamaModel(args.draft, options)
    # concurrency.body's sampling.
    params = None if args.temperature <= 0 else SamplingParams(args.temperature, **SAMPLING)
    prompts = [target.tokenize(prompt_text(i)) for i in range(args.requests)]
    # The target's passes: S sequences of L tokens each, for every S up to the most clients;
    # the draft's step over S sequences of a token.
    prompt = target.tokenize(PROMPTS[0])
    for each in (target, draft):
        for i in range(streams):
            each.sequence(i).reset()
            each.sequence(i).decode(prompt, 1)
    timed: dict[int, float] = {}
    for s in range(1, streams + 1):
        for length in (int(v) for v in args.lengths.split(",")):
            seconds = timed_pass(target, s, [prompt[-1]] * length, args.repeats)
            timed[s * length] = min(timed.get(s * length, seconds), seconds)
    steps = {s: timed_pass(draft, s, [prompt[-1]], args.repeats) for s in range(1, streams + 1)}
    hull = lower_hull(timed)
    print(
        "target passes (tokens: ms): "
        + ", ".join(f"{n}: {1e3 * v:.1f}" for n, v in sorted(timed.items()))
        + "; draft steps (sequences: ms): "
        + ", ".join(f"{s}: {1e3 * v:.1f}" for s, v in steps.items()),
        file=sys.stderr,
    )
    read = sum(len(p) - 1 for p in prompts)
    kinds = ["plain", "lookup", "either"] + ([] if params is None else ["either_coin"])
    kinds += ["ngram", "ngram_either"] + ([] if params is None else ["ngram_either_coin"])
    rows: list[dict[str, Any]] = []
    for number in range(1, (1 if params is None else args.sets) + 1):
        seeds = 1000 * number  # as server_duel.py --new-seeds gives its round ``number``
        texts, runs = workload_runs(target, draft, prompts, args.max_tokens, params, seeds)
        tokens = sum(len(t) for t in texts)
        for c in clients:
            row: dict[str, Any] = {"clients": c, "tokens": tokens}
            if params is not None:
                row["seeds"] = seeds
            # A draft step over s sequences guesses for each: at best its share of the
            # cheapest step per sequence with at most c sequences.
            per_guess = min(v / s for s, v in steps.items() if s <= c)
            for kind in kinds:
                by_draft = [
                    r[f"{kind}_first"] if i < c and f"{kind}_first" in r else r[kind]
                    for i, r in enumerate(runs)
                ]
                seconds, passes, guesses = bound(by_draft, c, hull, per_guess, read)
                row[kind] = {
                    "tok_s": round(tokens / seconds, 1) if tokens else 0.0,
                    "passes": passes,
                    "draft_guesses": guesses,
                }
            rows.append(row)
            print(
                ("" if params is None else f"seeds {seeds}: ")
                + f"{c} clients, {tokens} tokens, at most: "
                + "; ".join(
                    f"{k} {v['tok_s']} tok/s ({v['passes']} passes, "
                    f"{v['draft_guesses']} draft guesses)"
                    for k, v in row.items()
                    if isinstance(v, dict)
                )
            )
    if params is not None:
        for c in clients:
            rates = {k: [r[k]["tok_s"] for r in rows if r["clients"] == c] for k in kinds}
            print(
                f"{c} clients, mean of {args.sets} sets: "
                + "; ".join(
                    f"{k} {statistics.mean(v):.1f} tok/s ({min(v)}-{max(v)})"
                    for k, v in rates.items()
                )
            )
    if args.json:
        out = {
            "temperature": args.temperature,
            "passes_ms": {n: round(1e3 * v, 2) for n, v in sorted(timed.items())},
            "draft_steps_ms": {s: round(1e3 * v, 2) for s, v in steps.items()},
            "rows": rows,
        }
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
