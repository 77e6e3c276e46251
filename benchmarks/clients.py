"""What real clients get from a running `specgen serve`, each with its own defaults (and its
own random sampling: no seed): how many of their requests give them what they asked for (a
filled model, a tool call, a finished agent loop). The clients are in tests/clients.py, which the
compatibility suite (tests/integration/test_clients.py) runs with fixed seeds.

    specgen serve --api-key sk-specgen-test --port 8101 &   # the demo pair
    python benchmarks/clients.py --url http://127.0.0.1:8101 --runs 10

Each row: a client, what it asked for, how many runs it got it, and what it said otherwise.
No client reaches the network: requests elsewhere than the loopback go to a refused port.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.clients import CLIENTS, LOOPBACK_ONLY  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--runs", type=int, default=3, help="runs per client (at most 10)")
    parser.add_argument("--only", nargs="*", default=None, help="client names (default: all)")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args()
    os.environ.update(LOOPBACK_ONLY)
    rows = []
    for name, (what, run_one) in CLIENTS.items():
        if args.only and name not in args.only:
            continue
        said: Counter[str] = Counter()
        start = time.monotonic()
        for run in range(args.runs):
            try:
                problem = run_one(args.url, run, None)
            except Exception as err:  # the client's own error is the finding
                problem = f"{type(err).__name__}: {str(err).splitlines()[0][:70]}"
            said[problem or "ok"] += 1
        seconds = time.monotonic() - start
        otherwise = {k: v for k, v in said.items() if k != "ok"}
        rows.append(
            {
                "client": name,
                "what": what,
                "ok": said["ok"],
                "runs": args.runs,
                "seconds": round(seconds, 1),
                "otherwise": otherwise,
            }
        )
        print(f"{what:48} {said['ok']}/{args.runs}  {seconds:6.1f}s  {otherwise or ''}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
