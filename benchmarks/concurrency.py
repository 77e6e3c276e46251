"""Aggregate throughput of OpenAI-compatible servers under concurrent clients (issue 36).
`specgen serve` with and without speculation (-k 0) and with its batches open to the end
(specgen-open: --no-balance), and llama.cpp's llama-server with and
without it, each take C clients sharing one fixed workload of R distinct `/v1/completions`
requests (non-streaming; client i sends requests i, i+C, i+2C, ... one after another). Each
figure is measured on a fresh server: the sum of `usage.completion_tokens` over the wall time
from the first request sent to the last answer received (llama-server's less the end-of-generation
token it counts and specgen does not), and the mean request latency. The table
names each side's llama.cpp build (the features of specgen's, as `specgen doctor` lists them,
the CMake flags of llama-server's): compare servers of the same build, or say so. Sampled
(``--temperature``), each server draws its own texts from the request seeds, of other lengths:
one figure a server compares one set of texts; ``server_duel.py --new-seeds`` compares many.

    python benchmarks/concurrency.py --target T.gguf --draft D.gguf --clients 1,2,4,8 -n 128
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

try:
    import httpx2 as httpx  # what the venv has (as the other benchmarks import it)
except ImportError:
    import httpx

PROMPTS = [  # 16 distinct short prompts; request i takes prompt i (mod 16)
    "Write a short story about a lighthouse keeper.",
    "Explain why the sky is blue.",
    "Give a step-by-step recipe for a simple tomato soup.",
    "List ten countries in Europe and their capital cities.",
    "Describe how a bicycle works to a ten-year-old.",
    "Write a polite email asking a neighbour to turn down their music.",
    "What are the main causes of the seasons on Earth?",
    "Summarize the plot of a detective novel you invent.",
    "Explain the difference between weather and climate.",
    "Write a poem about autumn leaves in a city park.",
    "Give five tips for learning a new language as an adult.",
    "Describe a day in the life of a medieval blacksmith.",
    "Explain how vaccines train the immune system.",
    "Write a dialogue between a cat and a dog about breakfast.",
    "What should someone pack for a week of hiking in the mountains?",
    "Explain how a rainbow forms after a storm.",
]
SERVERS = ("specgen", "specgen-k0", "specgen-open", "llama-server", "llama-server-spec")
LLAMA = ("llama-server", "llama-server-spec")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--clients", default="1,2,4,8", help="comma list of client counts")
    parser.add_argument("--requests", type=int, default=8, help="requests in all, per figure")
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--servers", help=f"comma list of {','.join(SERVERS)} (default: all)")
    parser.add_argument("--llama-server", help="llama-server path (default: llama-cpp-peer.sh's)")
    parser.add_argument("--specgen-args", default="", help="more `specgen serve` flags")
    parser.add_argument("--json", help="write all rows to this file as JSON")
    parser.add_argument("--label", help="the pair's name in the table")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    servers = args.servers.split(",") if args.servers else list(SERVERS)
    if unknown := set(servers) - set(SERVERS):
        parser.error(f"unknown servers: {', '.join(sorted(unknown))}")
    llama = None
    if any(s in LLAMA for s in servers):
        llama = args.llama_server or peer_server()
        if not llama or not os.access(llama, os.X_OK):
            print(f"note: no llama-server ({llama or 'not built'}); skipping it", file=sys.stderr)
            servers = [s for s in servers if s not in LLAMA]
    parallel = any(s.startswith("specgen") for s in servers) and supports_parallel()
    if not parallel and any(s.startswith("specgen") for s in servers):
        print("note: `specgen serve` has no --parallel; running without it", file=sys.stderr)
    label = args.label or f"{Path(args.target).stem} / {Path(args.draft).stem}"
    # The builds compared: on one CPU, flags change a decode by more than the rounds' spread
    # (an AVX-512 build against an AVX2 one, each way by how many tokens a pass holds).
    builds: dict[str, str | None] = {}
    if any(s.startswith("specgen") for s in servers):
        builds["specgen"] = specgen_build()
    if llama and any(s in LLAMA for s in servers):
        builds["llama-server"] = llama_build(llama)
    rows = []
    for c in clients:  # every server at one client count, then the next: drift hits all alike
        for name in servers:
            program, flags = command(name, c, args, parallel, llama)
            print(f"{name}, {c} clients: {shlex.join(flags)}", file=sys.stderr)
            row = dict(pair=label, server=name, flags=shlex.join(flags), clients=c, agg_tps=None)
            row["build"] = builds.get("specgen" if name.startswith("specgen") else "llama-server")
            measured = measure(program, flags, c, args, eog_counted=name in LLAMA)
            rows.append(row := {**row, "mean_latency_s": None, **measured})
            print(
                f"  {row.get('completion_tokens')} tokens, {fmt(row['agg_tps'])} tok/s",
                file=sys.stderr,
            )
    tps = {(r["server"], r["clients"]): r["agg_tps"] for r in rows}
    for row in rows:
        row["ratio_to_llama"] = ratio(row["agg_tps"], best_llama(tps, row["clients"]))
    report(rows, clients, args, builds)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


def peer_server() -> str | None:
    """The llama-server that llama-cpp-peer.sh built, or None. The script builds it when it is
    missing (some 15 minutes): after a minute, leave that build running and go on without."""
    with tempfile.TemporaryFile() as out:
        peer = ["bash", "/work/shared/tools/llama-cpp-peer.sh", "--server-path"]
        done = subprocess.Popen(peer, stdout=out, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            done.wait(60)
        except subprocess.TimeoutExpired:
            print("note: llama-cpp-peer.sh is still building llama-server", file=sys.stderr)
            return None
        out.seek(0)
        path = (out.read().decode().strip().splitlines() or [""])[-1]
    return path if done.returncode == 0 and os.access(path, os.X_OK) else None


def specgen_build() -> str:
    """The features specgen's llama.cpp was built with, as ``specgen doctor`` lists them (in a
    child of this interpreter, which runs the servers)."""
    script = (
        "from specgen import backend; from specgen.checks import cpu_features; "
        "print(' '.join(cpu_features(backend.system_info())))"
    )
    found = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    return found.stdout.strip() or "unknown"


def llama_build(server: str) -> str | None:
    """How llama-server was configured (its build folder's CMake cache): native or not, and the
    CPU features turned on."""
    cache = Path(server).resolve().parents[1] / "CMakeCache.txt"
    if not cache.is_file():
        return None
    flags: dict[str, str] = {}
    for line in cache.read_text(errors="replace").splitlines():
        name, _, value = line.partition("=")
        key = name.split(":")[0]
        if key == "GGML_NATIVE" or key.startswith(("GGML_AVX", "GGML_FMA", "GGML_F16C")):
            flags[key.removeprefix("GGML_")] = value
    native = "native" if flags.pop("NATIVE", "OFF") == "ON" else "not native"
    return f"{native}; " + (" ".join(k for k, v in sorted(flags.items()) if v == "ON") or "-")


def supports_parallel() -> bool:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}  # no wrapped or styled help
    helped = subprocess.run(
        [sys.executable, "-m", "specgen", "serve", "-h"], capture_output=True, env=env
    )
    return b"--parallel" in helped.stdout


def command(
    name: str, clients: int, args: argparse.Namespace, parallel: bool, llama: str | None
) -> tuple[list[str], list[str]]:
    """The program with its model paths, and the flags to report (the port is added later)."""
    if name.startswith("specgen"):
        program = [sys.executable, "-m", "specgen", "serve"]
        program += ["--target", args.target, "--draft", args.draft]
        flags = ["--threads", "2", *(["--parallel", str(clients)] if parallel else [])]
        flags += shlex.split(args.specgen_args) + (["-k", "0"] if name == "specgen-k0" else [])
        flags += ["--no-balance"] if name == "specgen-open" else []
        return program, flags
    assert llama is not None
    program = [llama, "-m", args.target]
    flags = ["-c", "8192", "-np", str(clients), "-t", "2"]
    if name == "llama-server-spec":
        program += ["-md", args.draft]
        flags += ["-td", "2", "--spec-type", "draft-simple,ngram-mod", "--spec-draft-n-max", "8"]
    return program, flags


# What a sampled request sends beside its temperature (specgen's defaults, llama-server's too).
SAMPLING = dict(top_k=40, top_p=0.95, min_p=0.05)


def prompt_text(i: int) -> str:
    """Request ``i``'s prompt."""
    prompt = PROMPTS[i % len(PROMPTS)]
    if i >= len(PROMPTS):  # keep every request distinct past the list
        prompt += f" (Version {i // len(PROMPTS) + 1}.)"
    # A raw prompt with no newline after it makes small instruct models stop at once (7 of these
    # 16 give 0 tokens on SmolLM2-135M); with one, nearly all write max_tokens.
    return prompt + "\n"


def body(i: int, args: argparse.Namespace, seeds: int = 0) -> dict[str, object]:
    """Request ``i`` of the workload; sampled, with the seed ``seeds + i``."""
    request: dict[str, object] = dict(prompt=prompt_text(i), max_tokens=args.max_tokens)
    request["temperature"] = args.temperature
    if args.temperature > 0:
        request.update(seed=seeds + i, **SAMPLING)
    return request


def measure(
    program: list[str],
    flags: list[str],
    clients: int,
    args: argparse.Namespace,
    eog_counted: bool = False,
) -> dict[str, object]:
    """Start a fresh server, wait for /health to say 200, run the workload, stop the server."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile()
    server = subprocess.Popen(
        [*program, *flags, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        if not healthy(server, url):
            log.seek(0)
            tail = log.read().decode(errors="replace")[-2000:]
            return {"error": f"server exited with {server.returncode}: {tail}"}
        return workload(url, clients, args, eog_counted=eog_counted)
    finally:
        stop(server)
        log.close()


def free_port() -> int:
    """A loopback port free now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def healthy(server: subprocess.Popen[bytes], url: str) -> bool:
    """Wait until ``url``'s /health says 200 (True) or the server exits (False)."""
    while server.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    return False


def stop(server: subprocess.Popen[bytes]) -> None:
    """Stop a server as Ctrl-C would, killing it after 10 s."""
    server.send_signal(signal.SIGINT)
    try:
        server.wait(10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def workload(
    url: str, clients: int, args: argparse.Namespace, seeds: int = 0, eog_counted: bool = False
) -> dict[str, object]:
    """``args.requests`` requests sent by ``clients`` clients (sampled, with the seeds from
    ``seeds`` on). ``eog_counted``: the server counts an answer's end-of-generation token in
    ``completion_tokens`` (llama-server does, specgen does not): left out here, so that both
    count the tokens of the text alike."""
    bodies = [body(i, args, seeds) for i in range(args.requests)]
    tokens, latency = [0] * len(bodies), [0.0] * len(bodies)
    sent, answered, errors = [], [], []
    barrier = threading.Barrier(clients)

    def client(first: int) -> None:
        with httpx.Client(timeout=3600) as http:
            barrier.wait()
            for j in range(first, len(bodies), clients):
                started = time.perf_counter()
                sent.append(started)
                try:
                    reply = http.post(f"{url}/v1/completions", json=bodies[j])
                    if reply.status_code != 200:
                        errors.append(f"request {j}: HTTP {reply.status_code} {reply.text[:200]}")
                    else:
                        answer = reply.json()
                        tokens[j] = answer["usage"]["completion_tokens"]
                        # No stop strings are sent: "stop" is an end-of-generation token.
                        ended = answer["choices"][0]["finish_reason"] == "stop"
                        tokens[j] -= int(eog_counted and ended and tokens[j] > 0)
                except (httpx.HTTPError, KeyError, ValueError) as err:
                    errors.append(f"request {j}: {err!r}")
                answered.append(time.perf_counter())
                latency[j] = answered[-1] - started

    with ThreadPoolExecutor(clients) as pool:  # a thread, and an httpx client, per client
        list(pool.map(client, range(clients)))
    wall = max(answered) - min(sent)
    row = dict(requests=len(bodies), max_tokens=args.max_tokens, temperature=args.temperature)
    row.update(completion_tokens=sum(tokens), wall_s=wall, mean_latency_s=statistics.mean(latency))
    row.update(request_tokens=tokens)  # each request's, in order (``workload_bound.py``)
    if errors:
        return {**row, "error": "; ".join(errors)}
    return {**row, "agg_tps": sum(tokens) / wall}


def best_llama(tps: dict[tuple[str, int], object], clients: int) -> float | None:
    figures = [tps.get((server, clients)) for server in LLAMA]
    return max((x for x in figures if isinstance(x, float)), default=None)


def ratio(a: object, b: object) -> float | None:
    return a / b if isinstance(a, float) and isinstance(b, float) and b > 0 else None


def fmt(value: object, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if isinstance(value, float) else "—"


def table(header: list[str], lines: list[list[object]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for cells in lines:
        print("| " + " | ".join(str(cell) for cell in cells) + " |")


def report(
    rows: list[dict], clients: list[int], args: argparse.Namespace, builds: dict[str, str | None]
) -> None:
    sampling = f"temperature {args.temperature}"
    if args.temperature > 0:
        sampling += ", top_k 40, top_p 0.95, min_p 0.05, seed = request index"
    print(
        f"{args.requests} distinct /v1/completions requests per figure, max_tokens "
        f"{args.max_tokens}, {sampling}; non-streaming; a fresh server per figure; "
        "flags: all but the model paths and --port; tokens: the text's (llama-server's "
        "count less the end-of-generation token it adds)"
    )
    for side, build in builds.items():
        print(f"- {side}'s llama.cpp build: {build or 'unknown'}")
    print()
    header = ["pair", "server", "flags", "clients", "agg tok/s", "mean latency s"]
    cells = [[r["pair"], r["server"], f"`{r['flags']}`", r["clients"]] for r in rows]
    for r, line in zip(rows, cells):
        line += [fmt(r["agg_tps"], 1), fmt(r["mean_latency_s"]), fmt(r["ratio_to_llama"])]
    table([*header, "ratio to llama-server best at that client count"], cells)
    for r in rows:
        if "error" in r:
            print(f"{r['server']}, {r['clients']} clients failed: {r['error']}", file=sys.stderr)

    tps, lines = {(r["server"], r["clients"]): r["agg_tps"] for r in rows}, []
    for c in clients:
        mine = tps.get(("specgen", c))
        lines.append([c, fmt(ratio(mine, best_llama(tps, c)))])
        lines[-1] += [fmt(ratio(mine, tps.get(k))) for k in (("specgen-k0", c), ("specgen", 1))]
    print()
    header = ["clients", "specgen / best llama-server", "specgen / specgen-k0"]
    table([*header, "specgen(C) / specgen(1)"], lines)


if __name__ == "__main__":
    main()
