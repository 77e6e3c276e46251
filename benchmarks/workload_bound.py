"""The bound of ``concurrency.py``'s figures on their own workload: what the passes alone allow
when C clients each send their share of the requests one after another.

``batch_bound.py`` bounds a batch that always holds S streams. A figure of ``concurrency.py``
is not that: client i sends requests i, i + C, ... one after another, the requests end at their
own lengths (a short answer frees its client early), so the batch thins out towards the end and
its last requests run in a batch of one or two. This works the figure's bound out from the
passes that ``batch_bound.py --json`` timed and each request's length (the target alone's: the
``specgen-k0`` row of ``concurrency.py --json`` at the same client count, or ``--lengths``):
every stream of a batch of S gains rate(S) / S tokens a second, where rate(S) is the batch's
bound at S streams (plain batching S / V(S x 1); the draft model's guesses at acceptance alpha,
the best K; guesses that cost nothing at alpha); no prompt, host, scheduling or network time. A
batch size not timed is read on the line between its neighbours.

    python benchmarks/batch_bound.py T D -s 1,2,3,4,8 --json bound.json
    python benchmarks/concurrency.py --target T --draft D --json runs.json
    python benchmarks/workload_bound.py --bound bound.json --runs runs.json [--alpha 0.9,1]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path


def rates(bound: list[dict], key: str | None) -> Callable[[int], float]:
    """A batch's tokens per second at S streams: plain batching (``key`` None), else the best
    K of the column ``key`` (never below plain batching: K = 0 is always open)."""
    points = {}
    for row in bound:
        plain = float(row["plain_tok_s"])
        best = max([plain, *(float(v) for v in row[key].values())]) if key else plain
        points[int(row["streams"])] = best
    sizes = sorted(points)

    def at(s: int) -> float:
        if s in points:
            return points[s]
        below = max((n for n in sizes if n < s), default=sizes[0])
        above = min((n for n in sizes if n > s), default=sizes[-1])
        if below == above:
            return points[below] * s / below  # past the last size timed: no better per stream
        share = (s - below) / (above - below)
        return points[below] + share * (points[above] - points[below])

    return at


def wall_seconds(lengths: Sequence[int], clients: int, rate: Callable[[int], float]) -> float:
    """Seconds until the last answer: client i's requests i, i + clients, ... one after
    another, every stream of a batch of S gaining rate(S) / S tokens a second."""
    queues = [list(lengths[i::clients]) for i in range(clients)]
    left = {i: float(q.pop(0)) for i, q in enumerate(queues) if q}
    seconds = 0.0
    while left:
        each = rate(len(left)) / len(left)
        step = min(left.values()) / each
        seconds += step
        for i in list(left):
            left[i] -= step * each
            while i in left and left[i] <= 1e-9:
                if queues[i]:
                    left[i] = float(queues[i].pop(0))
                else:
                    del left[i]
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bound", type=Path, required=True, help="batch_bound.py --json")
    parser.add_argument("--runs", type=Path, help="concurrency.py --json (lengths, figures)")
    parser.add_argument("--lengths", help="each request's tokens, comma list (else --runs')")
    parser.add_argument("--clients", default="1,2,4,8")
    parser.add_argument("--alpha", default="0.9,1", help="acceptance rates to read")
    args = parser.parse_args()
    bound = json.loads(args.bound.read_text())
    runs = json.loads(args.runs.read_text()) if args.runs else []
    # Each client count's own lengths where its specgen-k0 row has them: a near tie that the
    # batch's float order tips can end a request at another length in another run.
    by_clients: dict[int, list[int]] = {}
    if args.lengths:
        lengths = [int(n) for n in args.lengths.split(",")]
    else:
        alone = [r for r in runs if r.get("server") == "specgen-k0" and r.get("request_tokens")]
        if not alone:
            parser.error("give --lengths, or --runs with specgen-k0 rows that hold request_tokens")
        lengths = alone[0]["request_tokens"]
        for row in alone:
            by_clients.setdefault(int(row["clients"]), list(row["request_tokens"]))
    columns: dict[str, str | None] = {"plain batching": None}
    for alpha in args.alpha.split(","):
        columns[f"draft model, alpha {alpha}"] = f"draft_model_alpha_{float(alpha)}"
        columns[f"free guesses, alpha {alpha}"] = f"free_guesses_alpha_{float(alpha)}"
    for clients_, own in sorted(by_clients.items()) or [(0, lengths)]:
        where = f" ({clients_} clients)" if by_clients else ""
        print(f"{len(own)} requests, {sum(own)} tokens{where}: {', '.join(map(str, own))}")
    measured: dict[tuple[str, int], float] = {
        (str(r["server"]), int(r["clients"])): float(r["agg_tps"]) for r in runs if "agg_tps" in r
    }
    servers = sorted({server for server, _ in measured})
    print("| clients | " + " | ".join(columns) + " | " + " | ".join(servers) + " |")
    print("|---" * (1 + len(columns) + len(servers)) + "|")
    for clients in (int(c) for c in args.clients.split(",")):
        own = by_clients.get(clients, lengths)
        bounds = [sum(own) / wall_seconds(own, clients, rates(bound, k)) for k in columns.values()]
        figures = [measured.get((server, clients)) for server in servers]
        print(
            f"| {clients} | "
            + " | ".join(f"{b:.1f}" for b in bounds)
            + " | "
            + " | ".join("—" if f is None else f"{f:.1f}" for f in figures)
            + " |"
        )


if __name__ == "__main__":
    main()
