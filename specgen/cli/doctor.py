"""``specgen doctor``: what this machine and this build of llama.cpp can do, and why
speculative decoding may not be faster here.

The facts and the advice are library code (``specgen.checks``); this module prints them, or
JSON.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from specgen.checks import BACKEND_SAMPLING_STATES, GPU_BUILDS, Facts, advice, facts
from specgen.cli.output import out, size


def doctor(
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the facts and advice as JSON.")
    ] = False,
    hub_timeout: Annotated[
        float,
        typer.Option(
            "--hub-timeout", metavar="SECONDS", min=0.1, help="How long to wait for the Hub."
        ),
    ] = 3.0,
    rpc: Annotated[
        str | None,
        typer.Option(
            "--rpc",
            metavar="HOST:PORT,...",
            help="Also check these `specgen worker`s (default: the workers your pairs name).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Check this machine, and why speculative decoding may not be faster here.

    The llama.cpp build, the CPU self-test, threads, caches, downloaded pairs, workers and the
    Hub.
    """
    found = facts(hub_timeout, rpc)
    tips = advice(found)
    if json_out:
        out.json({**found, "advice": tips}, indent=2)
        return
    _render(found, tips)


def _render(found: Facts, tips: list[str]) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    verdict = found["self_test"]
    rows = [
        ("llama-cpp-python", found["llama_cpp_python"]),
        (
            "backends",
            ", ".join(found["backends"]) + ("" if found["gpu_offload"] else " (no GPU offload)"),
        ),
        ("CPU features", " ".join(found["cpu_features"]) or "-"),
        (
            "CPU",
            f"{found['cpu']}, {found['logical_cpus']} logical CPUs"
            + (f", {found['physical_cores']} cores" if found["physical_cores"] else "")
            + (", lists AMX" if found["cpu_lists_amx"] else ""),
        ),
        ("threads", f"{found['default_threads']} by default (--threads to change)"),
        (
            "CPU self-test",
            {True: "passed", False: "FAILED", None: "-"}[verdict["ok"]]
            + ("" if verdict["ok"] else f": {verdict['message']}"),
        ),
    ]
    for name, folder in found["caches"].items():
        state = size(folder["bytes"]) if folder["exists"] else "absent"
        rows.append(
            (
                name,
                f"{folder['path']} ({state}" + ("" if folder["writable"] else ", read-only") + ")",
            )
        )
    pairs = [p["name"] for p in found["pairs"] if p["downloaded"]]
    rows.append(("pairs downloaded", ", ".join(pairs) or "none"))
    for pair in found["pairs"]:
        model = pair.get("target_layout")
        if (
            not pair["downloaded"]
            or not model
            or model["kind"] == "attention"
            and not model["mtp_heads"]
        ):
            continue
        line = f"{model['summary']}; rolls back by {model['rollback']}"
        if model.get("snapshot_bytes"):
            line += f" ({size(model['snapshot_bytes'])} of state)"
        measured = pair.get("rollback") or {}
        if measured:
            line += (
                f"; last run: {measured.get('bounded', 0)} by snapshot, "
                f"{measured.get('checkpoint', 0)} by checkpoint"
            )
            if measured.get("checkpoint_ms") is not None:
                line += f" ({measured['checkpoint_ms']:.2f} ms each)"
        rows.append((f"{pair['name']} target", line))
    rows.append(("MTP heads", "supported" if found["mtp_api"] else "not in this build"))
    rows.append(
        ("EAGLE3/DFlash heads", "supported" if found.get("heads_api") else "not in this build")
    )
    rows.append(("backend sampling", BACKEND_SAMPLING_STATES[found["backend_sampling"]]))
    for pair in found["pairs"]:
        shares = pair.get("host_share") or {}
        if shares:
            rows.append(
                (
                    f"{pair['name']} loop",
                    "host work outside the models: "
                    + ", ".join(f"{share:.1%} of a cycle {mode}" for mode, share in shares.items())
                    + " (as the last runs measured it)",
                )
            )
    rows.append(("RPC (workers)", "built in" if found["rpc"] else "not in this build"))
    for worker in found["workers"]:
        if worker.get("error"):
            state = f"[red]{escape(worker['error'])}[/]"
        else:
            devices = ", ".join(
                f"{escape(d['name'])} {size(d['free_bytes'])} free of {size(d['total_bytes'])}"
                for d in worker["devices"]
            )
            state = (
                f"protocol {worker['protocol']}, {worker['round_trip_ms']:.1f} ms round "
                f"trip; {devices}"
            )
        rows.append((f"worker {worker['endpoint']}", state))
    rows.append(("Hugging Face Hub", f"{found['hub']['endpoint']}: {found['hub']['state']}"))
    if not found["gpu_offload"]:
        rows.append(("GPU builds", "; ".join(f"{k}: {v}" for k, v in GPU_BUILDS.items())))
    for name, value in rows:
        table.add_row(name, value)
    out.out.print(table)
    out.out.print("\n[bold]why it may not be faster here[/]")
    for tip in tips or ["nothing found: run `specgen bench` to see what pays on this machine"]:
        out.out.print(f"- {tip}", highlight=False)
