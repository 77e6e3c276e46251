"""Two or more `specgen serve` kept up at once, ``concurrency.py``'s workload alternated between
them round by round: ratios of warm servers side by side, as little apart in time as one
workload, so a noisy machine's drift falls on both.

Each server is ``NAME[@TREE]=FLAGS``: its `specgen serve` flags (the pair, ``--threads 2`` and
``--parallel`` the most clients are added), run from a checkout of specgen at TREE (this one if
none: another commit's worktree, for an A/B of code), with a cache of its own (a fresh one, or a
copy of ``--cache``). Round 0 warms every server and is not counted; in each round after it
every client count runs once on every server, the servers' order flipped each round. Printed:
each round's tok/s, the means and each server's ratio to the first, the ratio paired by round
(the geometric mean of each round's ratio, with its 95% interval: a ratio whose interval holds
1.0 is not told from noise by these rounds), and what `/metrics` says of the batches (target
passes and mean guesses a sequence, by the sequences in a pass).

    python benchmarks/server_duel.py --target T.gguf --draft D.gguf --server auto= \\
        --server "k0=-k 0" --clients 2,4 --rounds 6 --common "--lookup-cache off"

``--common "--lookup-cache off"`` keeps the suffix cache from learning the workload's answers
across rounds (a warm server would otherwise guess its repeated answers whole).

``--fresh``: each workload runs on a server started for it and stopped after (as
``concurrency.py``'s figures do), each server keeping its own cache from one start to the next,
as a user's restarted server does: what a process learns that the next one starts from.
``--cold`` (with ``--fresh`` and ``--cache``): each start begins from a new copy of ``--cache``
instead, as a first server on a machine does (a cache that ran the pair alone, say, with no
batch's verdicts in it), round after round.

``NAME@llama-server=FLAGS``: llama.cpp's llama-server (``--llama-server``, or the one
``llama-cpp-peer.sh`` built) as ``concurrency.py`` starts it (``-c 8192 -np`` the most clients
``-t 2``, then FLAGS; ``--common`` is specgen's only), its tokens counted as specgen counts
them. Sampled, each server samples with its own generator, so one set of seeds gives each server
texts of its own, of other lengths (one such set gave llama-server 442 tokens of SmolLM2's 1024
where specgen wrote 784) for every round: ``--new-seeds`` gives each round seeds of its own, the
same for every server in the round, so the rounds compare the servers over many texts.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from concurrency import (  # noqa: E402
    command,
    free_port,
    healthy,
    httpx,
    peer_server,
    stop,
    workload,
)
from paired import paired_ratio  # noqa: E402

HERE = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument(
        "--server", action="append", required=True, help="NAME[@TREE]=FLAGS, twice or more"
    )
    parser.add_argument("--clients", default="2,4", help="comma list of client counts")
    parser.add_argument("--rounds", type=int, default=6, help="counted rounds, after a warm-up")
    parser.add_argument("--requests", type=int, default=8, help="requests in all, per figure")
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--common", default="", help="flags every server gets")
    parser.add_argument("--cache", type=Path, help="a specgen cache each server starts from")
    parser.add_argument(
        "--fresh", action="store_true", help="a server started for each workload, its cache kept"
    )
    parser.add_argument(
        "--new-seeds", action="store_true", help="sampled: each round's requests, new seeds"
    )
    parser.add_argument(
        "--cold", action="store_true", help="with --fresh: each start from a new copy of --cache"
    )
    parser.add_argument("--llama-server", help="llama-server path (default: llama-cpp-peer.sh's)")
    args = parser.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    if len(args.server) < 2:
        parser.error("give --server twice or more")
    if args.cold and not (args.fresh and args.cache):
        parser.error("--cold starts each server afresh from --cache: give --fresh and --cache")
    scratch = Path(tempfile.mkdtemp(prefix="specgen-duel-"))
    servers: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    specs = {spec.partition("=")[0].partition("@")[0]: spec for spec in args.server}
    if any(is_llama(spec) for spec in args.server):
        args.llama_server = args.llama_server or peer_server()
        if not args.llama_server:
            parser.error("no llama-server: give --llama-server, or build llama-cpp-peer.sh's")
    try:
        if not args.fresh:
            for spec in args.server:
                name, url, process = start(spec, max(counts), args, scratch)
                servers[name] = (process, url)
        names = list(specs)
        rates: dict[tuple[str, int], list[float]] = {(s, c): [] for s in names for c in counts}
        for round_ in range(args.rounds + 1):
            order = names if round_ % 2 else names[::-1]
            seeds = 1000 * round_ if args.new_seeds else 0
            for clients in counts:
                for name in order:
                    llama = is_llama(specs[name])
                    if args.fresh:
                        _, url, process = start(specs[name], max(counts), args, scratch)
                        try:
                            row = workload(url, clients, args, seeds, eog_counted=llama)
                        finally:
                            stop(process)
                    else:
                        row = workload(servers[name][1], clients, args, seeds, eog_counted=llama)
                    if "error" in row:
                        sys.exit(f"{name} at {clients} clients: {row['error']}")
                    if round_:
                        rates[(name, clients)].append(float(row["agg_tps"]))  # type: ignore[arg-type]
            if round_:
                figures = "  ".join(
                    f"{n}@{c} {rates[(n, c)][-1]:.1f}" for c in counts for n in names
                )
                print(f"round {round_}: {figures}", flush=True)
        for clients in counts:
            first = statistics.mean(rates[(names[0], clients)])
            means = "  ".join(
                f"{n} {statistics.mean(rates[(n, clients)]):.1f} "
                f"({statistics.mean(rates[(n, clients)]) / first:.3f})"
                for n in names
            )
            print(f"{clients} clients, mean tok/s (/ {names[0]}): {means}")
            paired = "  ".join(
                "{} {:.3f} ({:.3f}-{:.3f})".format(
                    n, *paired_ratio(rates[(names[0], clients)], rates[(n, clients)])
                )
                for n in names[1:]
            )
            print(f"{clients} clients, paired by round (/ {names[0]}, 95% interval): {paired}")
        for name in servers:
            if not is_llama(specs[name]):
                print(f"{name}: {batches(servers[name][1])}")
    finally:
        for process, _ in servers.values():
            stop(process)
        shutil.rmtree(scratch, ignore_errors=True)


def start(
    spec: str, parallel: int, args: argparse.Namespace, scratch: Path
) -> tuple[str, str, subprocess.Popen[bytes]]:
    """Start one server of ``NAME[@TREE]=FLAGS`` and wait for /health: its name, URL, process."""
    head, _, flags = spec.partition("=")
    name, _, tree = head.partition("@")
    port = free_port()
    if is_llama(spec):  # as concurrency.py starts it
        program, given = command("llama-server", parallel, args, True, args.llama_server)
        program += [*given, *shlex.split(flags), "--port", str(port)]
        root, env = HERE, dict(os.environ)
    else:
        root = Path(tree).resolve() if tree else HERE
        cache = server_cache(name, args, scratch)
        env = {**os.environ, "SPECGEN_CACHE": str(cache), "PYTHONPATH": str(root)}
        program = [sys.executable, "-m", "specgen", "serve", "--target", args.target]
        program += ["--draft", args.draft, "--threads", "2", "--parallel", str(parallel)]
        program += [*shlex.split(args.common), *shlex.split(flags), "--port", str(port)]
    log = open(scratch / f"{name}.log", "wb")  # noqa: SIM115 (the server's, till it stops)
    process = subprocess.Popen(program, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    if not healthy(process, url):
        tail = (scratch / f"{name}.log").read_text(errors="replace")[-2000:]
        sys.exit(f"{name} exited with {process.returncode}: {tail}")
    return name, url, process


def server_cache(name: str, args: argparse.Namespace, scratch: Path) -> Path:
    """The cache a specgen server ``name`` starts with: kept from one start to the next
    (``--fresh``), a copy of ``--cache`` at its first start, or at every start (``--cold``)."""
    cache = scratch / f"cache-{name}"
    if args.cold:
        shutil.rmtree(cache, ignore_errors=True)
    if not cache.exists() and args.cache is not None:
        shutil.copytree(args.cache, cache)
    cache.mkdir(exist_ok=True)
    return cache


def is_llama(spec: str) -> bool:
    """Whether ``NAME[@TREE]=FLAGS`` names llama-server (TREE ``llama-server``)."""
    return spec.partition("=")[0].partition("@")[2] == "llama-server"


def batches(url: str) -> str:
    """What /metrics says of the batches: passes and mean guesses a sequence, by size."""
    passes: dict[str, str] = {}
    guesses: dict[str, str] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        for metric, into in (
            ("specgen_batch_target_passes{", passes),
            ("specgen_batch_mean_lookahead{", guesses),
        ):
            if line.startswith(metric):
                size = line.split('"')[1]
                into[size] = line.rsplit(" ", 1)[1]
    sizes = sorted(passes, key=int)
    return ", ".join(
        f"{s}: {float(passes[s]):.0f} passes, K {float(guesses.get(s, 'nan')):.2f}" for s in sizes
    )


if __name__ == "__main__":
    main()
