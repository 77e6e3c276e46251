"""What a fixed set of commands print, recorded so that a refactor can show it changed nothing.

Runs `specgen` as a user would (a subprocess each, the demo pairs from the package index, greedy
so the text is the same run to run) and writes one JSON file: for each command its exit code,
its stdout and stderr with the figures that vary from run to run (timings, seeds, paths of
temporary folders) masked, and for JSON outputs the tree of keys and the values that do not
depend on timing. Two recordings (before and after a change) are compared with --compare.

    python benchmarks/behaviour.py record before.json
    python benchmarks/behaviour.py record after.json
    python benchmarks/behaviour.py compare before.json after.json

Every command runs with its own SPECGEN_HOME and SPECGEN_CACHE (the fetched and converted models
linked in from ~/.cache/specgen, or $SPECGEN_TEST_MODELS), so nothing remembered from an earlier
recording (the costs -k auto keeps, a bench memo) changes what a later one does.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SMOL = "smollm2-135m-demo"
GEMMA = "gemma3-270m-demo"
PROMPT = "What is speculative decoding?"
STORY = "Once upon a time, in a small village,"
GREEDY = ["--temperature", "0", "--threads", "2"]
# Figures that depend on the clock, and the folders of one recording.
_VARYING = re.compile(r"\d+(\.\d+)?(x| ?tok/s| ?ms|s\b| ?%)|seed \d+|\d+(\.\d+)? (GB|MB|kB)")
# Stats that depend only on the text (greedy, fixed K): kept as values; the rest as keys.
_EXACT_STATS = (
    "lookahead",
    "prompt_tokens",
    "generated_tokens",
    "stop_reason",
    "cycles",
    "drafted",
    "accepted",
    "position_accept_rates",
    "drafters",
)


def commands(tmp: Path) -> dict[str, list[str]]:
    prompts = tmp / "prompts.txt"
    prompts.write_text("The capital of France is\nList three colours:\n")
    batch = tmp / "batch.jsonl"
    batch.write_text(
        json.dumps({"id": "a", "prompt": "Name a fruit:", "max_tokens": 6})
        + "\n"
        + "{oops\n"
        + json.dumps({"id": "b", "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 6})
        + "\n"
    )
    runs: dict[str, list[str]] = {}
    for pair, prompt in ((SMOL, PROMPT), (GEMMA, STORY)):
        for k in ("0", "4", "auto"):
            runs[f"run {pair} -k {k}"] = [
                "run",
                prompt,
                "--pair",
                pair,
                "-k",
                k,
                "-n",
                "48",
                *GREEDY,
                "--json",
            ]
        runs[f"run {pair} ngram"] = [
            "run",
            prompt,
            "--pair",
            pair,
            "--draft",
            "ngram",
            "-k",
            "auto",
            "-n",
            "48",
            *GREEDY,
            "--json",
        ]
        runs[f"run {pair} -k 4 text"] = [
            "run",
            prompt,
            "--pair",
            pair,
            "-k",
            "4",
            "-n",
            "24",
            *GREEDY,
        ]
    runs["run --no-ngram -k 3 --raw stop"] = [
        "run",
        "Count: 1, 2, 3,",
        "--pair",
        SMOL,
        "--no-ngram",
        "-k",
        "3",
        "--raw",
        "--stop",
        "8",
        "-n",
        "40",
        *GREEDY,
        "--json",
    ]
    runs["run system"] = [
        "run",
        "Hi",
        "--pair",
        SMOL,
        "--system",
        "Be brief.",
        "-k",
        "4",
        "-n",
        "16",
        *GREEDY,
        "--json",
    ]
    runs["batch each-line"] = [
        "run",
        "-f",
        str(prompts),
        "--each-line",
        "--pair",
        SMOL,
        "-k",
        "4",
        "-n",
        "8",
        *GREEDY,
    ]
    runs["batch jsonl"] = ["run", "-f", str(batch), "--pair", SMOL, "-k", "4", *GREEDY]
    runs["bench"] = [
        "bench",
        "--pair",
        SMOL,
        "-k",
        "2,auto,ngram",
        "-n",
        "8",
        "--prompts",
        str(prompts),
        "--threads",
        "2",
        "--temperature",
        "0",
        "--json",
        str(tmp / "bench.json"),
    ]
    runs["models list"] = ["models", "list"]
    runs["models list --json"] = ["models", "list", "--json"]
    runs["models list -v"] = ["models", "list", "-v"]
    runs["models check"] = ["models", "check", SMOL]
    runs["models path"] = ["models", "path"]
    runs["doctor --json"] = ["doctor", "--json", "--hub-timeout", "0.5"]
    for command in (
        [],
        ["run"],
        ["bench"],
        ["serve"],
        ["models"],
        ["models", "list"],
        ["doctor"],
        ["worker"],
    ):
        runs[" ".join(["help", *command])] = [*command, "--help"]
    bad = {
        "bad -k": ["run", "hi", "--target", "x.gguf", "-k", "65"],
        "bad -k word": ["run", "hi", "--target", "x.gguf", "-k", "banana"],
        "bad --top-p": ["run", "hi", "--target", "x.gguf", "--top-p", "0"],
        "bad --min-p": ["run", "hi", "--target", "x.gguf", "--min-p", "1"],
        "bad --ctx-size": ["run", "hi", "--target", "x.gguf", "--ctx-size", "100"],
        "missing target": ["run", "hi", "--target", str(tmp / "nope.gguf")],
        "folder target": ["run", "hi", "--target", str(tmp)],
        "unknown pair": ["run", "hi", "--pair", "smollm2-demo"],
        "pair member": ["run", "hi", "--target", f"{SMOL}:foo"],
        "draft alone": ["run", "hi", "--draft", "d.gguf"],
        "empty prompt": ["run", "  ", "--target", "x.gguf"],
        "resume without output": [
            "run",
            "-f",
            str(prompts),
            "--each-line",
            "--resume",
            "--target",
            "x.gguf",
        ],
        "output without batch": ["run", "hi", "-o", str(tmp / "o.jsonl"), "--target", "x.gguf"],
        "system and raw": ["run", "hi", "--pair", SMOL, "--system", "x", "--raw", "-n", "2"],
        "bench bad -k": ["bench", "--pair", SMOL, "-k", "0"],
        "bench no draft": ["bench", "--target", f"{SMOL}:target", "-k", "4"],
        "check without draft": ["models", "check", "--target", "x.gguf"],
        "bad rpc": ["run", "hi", "--target", "x.gguf", "--rpc", "[::1]:1"],
    }
    runs.update({f"error {name}": args for name, args in bad.items()})
    return runs


def environment(tmp: Path) -> dict[str, str]:
    models = Path(os.environ.get("SPECGEN_TEST_MODELS") or Path.home() / ".cache" / "specgen")
    cache, home = tmp / "cache", tmp / "home"
    cache.mkdir()
    home.mkdir()
    for folder in ("pip", "derived"):
        (models / folder).mkdir(parents=True, exist_ok=True)
        (cache / folder).symlink_to(models / folder, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECGEN_", "HF_"))}
    return {
        **env,
        "SPECGEN_HOME": str(home),
        "SPECGEN_CACHE": str(cache),
        "HF_HOME": str(tmp / "hf"),
        "HF_HUB_OFFLINE": "1",
        "COLUMNS": "100",
        "SPECGEN_SELFTEST": "0",
    }


def mask(text: str, tmp: Path) -> str:
    text = text.replace(str(tmp), "<tmp>").replace(str(Path.home()), "<home>")
    return _VARYING.sub("<n>", text)


def keys(value: Any, prefix: str = "") -> list[str]:
    """Every key path of a JSON value (lists: the keys of their items, once)."""
    if isinstance(value, dict) and value and all(k.isdigit() for k in value):
        value = {"<n>": next(iter(value.values()))}  # numbered keys (cycles by K) stand for one
    if isinstance(value, dict):
        return sorted(
            {p for k, v in value.items() for p in [f"{prefix}.{k}", *keys(v, f"{prefix}.{k}")]}
        )
    if isinstance(value, list):
        return sorted({p for item in value for p in keys(item, f"{prefix}[]")})
    return []


def exact(record: dict[str, Any]) -> dict[str, Any]:
    """What a greedy run's JSON says that does not depend on the clock."""
    out: dict[str, Any] = {"text": record.get("text"), "params": record.get("params")}
    stats = record.get("stats") or {}
    fixed_k = isinstance(stats.get("lookahead"), int)
    out["stats"] = {
        k: stats.get(k)
        for k in _EXACT_STATS
        if fixed_k or k in ("lookahead", "prompt_tokens", "generated_tokens", "stop_reason")
    }
    return out


def record(path: Path) -> None:
    found: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="specgen-behaviour-") as name:
        tmp = Path(name)
        env = environment(tmp)
        for label, args in commands(tmp).items():
            done = subprocess.run(
                [sys.executable, "-m", "specgen", *args],
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
                stdin=subprocess.DEVNULL,
            )
            entry: dict[str, Any] = {"exit": done.returncode}
            stdout = done.stdout.replace(str(tmp), "<tmp>").replace(str(Path.home()), "<home>")
            try:
                parsed = (
                    [json.loads(line) for line in stdout.splitlines()]
                    if args[0] == "run" and "--json" not in args
                    else [json.loads(stdout)]
                )
            except ValueError:
                parsed = None
            if parsed is not None and stdout.strip():
                entry["keys"] = keys(parsed)
                entry["values"] = [
                    exact(p)
                    if isinstance(p, dict) and "stats" in p
                    else (p if label.startswith("models list") else None)
                    for p in parsed
                ]
            else:
                entry["stdout"] = mask(done.stdout, tmp)
            entry["stderr"] = mask(done.stderr, tmp)
            if label == "bench":
                bench = json.loads((tmp / "bench.json").read_text())
                entry["bench_keys"] = keys(bench)
                # The table's figures, what it recommends and its warnings move with the
                # machine's noise: its JSON says what it measures.
                entry.pop("stdout", None)
            found[label] = entry
            print(f"{label}: exit {done.returncode}", file=sys.stderr, flush=True)
    path.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")


def compare(before: Path, after: Path) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    differ = 0
    for label in sorted(set(a) | set(b)):
        if a.get(label) == b.get(label):
            continue
        differ += 1
        print(f"--- {label}")
        for field in sorted(set(a.get(label, {})) | set(b.get(label, {}))):
            x, y = a.get(label, {}).get(field), b.get(label, {}).get(field)
            if x != y:
                print(
                    f"  {field}:\n    before: {json.dumps(x)[:2000]}\n"
                    f"    after:  {json.dumps(y)[:2000]}"
                )
    print(f"{len(set(a) | set(b)) - differ} of {len(set(a) | set(b))} commands unchanged")
    return 1 if differ else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser("record").add_argument("path", type=Path)
    both = sub.add_parser("compare")
    both.add_argument("before", type=Path)
    both.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.verb == "record":
        record(args.path)
    else:
        sys.exit(compare(args.before, args.after))


if __name__ == "__main__":
    main()
