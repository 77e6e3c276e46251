"""What ``specgen doctor`` checks: this machine, this build of llama.cpp, the caches, the
downloaded pairs, the workers and the Hub (``facts``), and why speculative decoding may not be
faster here (``advice``, pure: it reads the facts, so tests feed it made-up machines).

Library code: nothing is printed (``specgen.cli.doctor`` renders it).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any, Literal, TypedDict

GPU_BUILDS = {
    "CUDA (NVIDIA)": 'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir '
    "llama-cpp-python",
    "Metal (Apple)": 'CMAKE_ARGS="-DGGML_METAL=on" pip install --force-reinstall '
    "--no-cache-dir llama-cpp-python",
    "Vulkan": 'CMAKE_ARGS="-DGGML_VULKAN=on" pip install --force-reinstall --no-cache-dir '
    "llama-cpp-python",
}


class PairFacts(TypedDict):
    """One pair of models.toml as doctor sees it (``--json``'s ``pairs``)."""

    name: str
    downloaded: bool
    host_share: dict[str, float]  # mode -> the loop's share of a cycle, as last measured
    files: dict[str, str | None]
    bench: dict[str, Any]  # what bench found here (``session.memo``), by mode
    draft_model: bool
    target_layout: dict[str, Any] | None
    rollback: dict[str, Any]


class Facts(TypedDict):
    """Everything doctor knows about this machine (``--json``, less ``advice``)."""

    llama_cpp_python: str
    system_info: str
    cpu_features: list[str]
    backends: list[str]
    gpu_offload: bool
    nvidia_gpu_present: bool
    cpu: str
    cpu_lists_amx: bool
    logical_cpus: int | None
    physical_cores: int | None
    default_threads: int
    others_busy: float | None  # CPUs other processes kept busy while doctor looked
    self_test: dict[str, Any]
    caches: dict[str, dict[str, Any]]
    pairs: list[PairFacts]
    mtp_api: bool
    heads_api: bool  # EAGLE3 and DFlash heads (``backend.heads``)
    backend_sampling: Literal["on", "off", "absent"]
    rpc: bool
    workers: list[dict[str, Any]]
    hub: dict[str, Any]


def cpu_features(info: str) -> list[str]:
    """The features llama.cpp's system info lists as set (``AVX2 = 1``), sorted: what a build
    has, as doctor shows it."""
    return sorted({m.group(1) for m in re.finditer(r"(\w+) = 1", info)})


def facts(hub_timeout: float = 3.0, rpc: str | None = None) -> Facts:
    """Everything doctor knows about this machine, as plain data."""
    from specgen import backend
    from specgen.host.machine import (
        cpu_flags,
        cpu_name,
        default_threads,
        load_now,
        physical_cores,
    )
    from specgen.host.store import cache_root
    from specgen.models.registry import user_models_file

    info = backend.system_info()
    flags = cpu_flags().split()
    cores = physical_cores()
    return {
        "llama_cpp_python": backend.library_version(),
        "system_info": info,
        "cpu_features": cpu_features(info),
        "backends": _backends(info),
        "gpu_offload": backend.supports_gpu_offload(),
        "nvidia_gpu_present": Path("/proc/driver/nvidia/version").exists()
        or shutil.which("nvidia-smi") is not None,
        "cpu": cpu_name(),
        "cpu_lists_amx": "amx_tile" in flags,
        "logical_cpus": os.cpu_count(),
        "physical_cores": cores,
        "default_threads": default_threads(),
        "others_busy": load_now(0.5),
        "self_test": _self_test(),
        "caches": {
            "your models.toml": _folder(user_models_file()),
            "specgen cache": _folder(cache_root()),
            "Hugging Face cache": _folder(Path(_hf_cache())),
        },
        "pairs": _pairs(),
        "mtp_api": backend.supports_mtp(),
        "heads_api": backend.supports_heads(),
        "backend_sampling": backend.backend_sampling(),
        "rpc": backend.supports_rpc(),
        "workers": _worker_rows(rpc),
        "hub": _hub(hub_timeout),
    }


def advice(found: Facts) -> list[str]:
    """Why speculative decoding may not be faster here, and what to do; pure."""
    tips = []
    if found["self_test"].get("ok") is False:
        tips.append(found["self_test"]["message"])
    built_with_amx = any(f.startswith("AMX") for f in found["cpu_features"])
    if found["cpu_lists_amx"] and built_with_amx and found["self_test"].get("ok") is None:
        tips.append(
            "the CPU lists AMX: if generation dies with 'Illegal instruction', "
            "rebuild llama-cpp-python portably (see the README's install section)"
        )
    if not found["gpu_offload"] and found["nvidia_gpu_present"]:
        tips.append(
            "this machine has an NVIDIA GPU but llama.cpp was built for the CPU only: "
            f"rebuild it with CUDA: {GPU_BUILDS['CUDA (NVIDIA)']}"
        )
    if found["gpu_offload"]:
        tips.append(
            "a GPU build: keep the draft on the GPU too (--draft-gpu-layers -1, the "
            "default); a draft left on the CPU often costs more than it saves"
        )
    for worker in found["workers"]:
        if worker.get("error"):
            tips.append(f"worker {worker['endpoint']}: {worker['error']}")
        elif worker["round_trip_ms"] > 5:
            tips.append(
                f"worker {worker['endpoint']}: {worker['round_trip_ms']:.0f} ms per round "
                f"trip, paid once per cycle: run `specgen bench --rpc "
                f"{worker['endpoint']}` to find the K that amortizes it"
            )
    cores, threads = found["physical_cores"], found["default_threads"]
    from specgen.host.machine import BUSY_FROM, threads_given

    others = found.get("others_busy")
    if others is not None and others >= BUSY_FROM:
        cpus = found["logical_cpus"] or 1
        given = threads_given(threads, cpus, others)
        tips.append(
            f"other processes keep {others:.1f} of {cpus} CPUs busy now: run, chat and serve "
            f"use {given} thread{'s' if given != 1 else ''} instead of {threads} while they do "
            "(a decode waits for its slowest thread); bench measures best on an idle machine"
        )
    if cores and threads > cores:
        tips.append(
            f"the default of {threads} threads is more than the {cores} physical "
            f"cores: pass --threads {cores}"
        )
    for pair in found["pairs"]:
        model = pair.get("target_layout") or {}
        if model.get("few_active_experts") and pair.get("draft_model"):
            tips.append(
                f"{pair['name']}: its target is a mixture of experts running "
                f"{model['experts']} experts a token, so its steps are cheap and a separate "
                f"draft model rarely pays: try --draft ngram"
                + (" or its MTP head (--draft mtp)" if model.get("mtp_heads") else "")
            )
        if model.get("mtp_heads") and not found.get("mtp_api", True):
            tips.append(
                f"{pair['name']}: its target has an MTP head, but this llama-cpp-python lacks "
                f"llama.cpp's MTP functions: install 0.3.36 or later to draft with it"
            )
        measured = pair.get("rollback") or {}
        if measured.get("checkpoint") and measured.get("checkpoint_ms") is not None:
            tips.append(
                f"{pair['name']}: its recurrent target rolled back by state checkpoint "
                f"{measured['checkpoint']} times ({measured['checkpoint_ms']:.2f} ms each): "
                f"a K within its snapshots (-k auto, or -k {measured['snapshots']} or less) "
                f"avoids that"
            )
        bench = pair.get("bench") or {}
        for mode, result in bench.items():
            if result.get("variant") == 0:
                tips.append(
                    f"{pair['name']}: `specgen bench` found that no K pays at {mode} "
                    f"decoding here; run it with -k 0, or try a smaller draft"
                )
            ratio = result.get("cost_ratio")
            if isinstance(ratio, float) and ratio > 0.5:
                tips.append(
                    f"{pair['name']}: the draft costs {ratio:.2f} of a target step "
                    f"here; a draft that slow rarely pays back: pick a "
                    f"smaller one, or --draft ngram"
                )
    if found["gpu_offload"]:
        tips += _loop_advice(found)
    if not found["pairs"] or not any(p["downloaded"] for p in found["pairs"]):
        tips.append("no pair downloaded yet: `specgen models pull` fetches the default one")
    elif not any(p.get("bench") for p in found["pairs"] if p["downloaded"]):
        tips.append(
            "run `specgen bench` once per pair: it measures which K pays on this "
            "machine, and `specgen run` uses it from then on"
        )
    return tips


BACKEND_SAMPLING_STATES = {
    "on": "top-k on llama.cpp's backend when sampling; greedy: the top-1 there where rows are "
    "computed on a GPU, the argmax here on a CPU (whole rows under a grammar, logit_bias, "
    "logprobs, --top-k 0)",
    "off": "off (SPECGEN_BACKEND_SAMPLING=0): whole rows on the host",
    "absent": "not in this build: whole rows on the host",
}
# On a GPU a target step is a few milliseconds: past this share of a cycle, the loop's own host
# work is what limits the speedup.
HOST_SHARE_LIMITS = 0.15


def _loop_advice(found: Facts) -> list[str]:
    """On a GPU build: where the loop's host work (as ``-k auto`` measured it) limits the
    speedup, and backend sampling turned off or missing."""
    tips = []
    state = found.get("backend_sampling")
    if state == "off":
        tips.append(
            "backend sampling is turned off (SPECGEN_BACKEND_SAMPLING=0): each row of logits "
            "then crosses to the host whole; unset it"
        )
    elif state == "absent":
        tips.append(
            "this llama-cpp-python has no backend sampling: each row of logits crosses to the "
            "host whole; install llama-cpp-python 0.3.36 or later"
        )
    for pair in found["pairs"]:
        for mode, share in (pair.get("host_share") or {}).items():
            if share > HOST_SHARE_LIMITS:
                tips.append(
                    f"{pair['name']}: the loop's own host work is {share:.0%} of each cycle at "
                    f"{mode} decoding, and limits the speedup on this GPU: keep a --top-k "
                    f"(0 reads whole rows), and leave out logprobs and logit_bias, which do too"
                )
    return tips


def _backends(info: str) -> list[str]:
    names = [
        name
        for name in ("CUDA", "Metal", "Vulkan", "SYCL", "HIP", "OpenCL", "RPC", "BLAS")
        if re.search(rf"\b{name}\b", info, re.IGNORECASE)
    ]
    return ["CPU", *names]


def _hf_cache() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _folder(path: Path) -> dict[str, Any]:
    size = 0
    if path.is_dir():
        for root, _, files in os.walk(path):
            for name in files:
                try:
                    size += os.lstat(os.path.join(root, name)).st_size
                except OSError:
                    pass
    elif path.is_file():
        size = path.stat().st_size
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return {
        "path": str(path),
        "exists": path.exists(),
        "bytes": size,
        "writable": os.access(existing, os.W_OK),
    }


def _self_test() -> dict[str, Any]:
    """The cached CPU self-test verdict for the default pair's files, if they are here."""
    from specgen.models.registry import Registry, cached
    from specgen.models.selftest import cached_verdict

    try:
        pair = Registry.load().pair()
    except Exception:  # a broken models.toml is reported by the commands that read it
        return {"ok": None, "message": "no default pair to test with"}
    paths = [p for _, spec in pair.members() if (p := cached(spec)) is not None]
    if not paths:
        return {"ok": None, "message": "not run yet (it runs before the first generation)"}
    verdict = cached_verdict(paths)
    if verdict is None:
        return {"ok": None, "message": "not run yet (it runs before the first generation)"}
    return {"ok": verdict.ok, "message": "passed" if verdict.ok else verdict.message()}


def _pairs() -> list[PairFacts]:
    from specgen.models.registry import Registry, cached
    from specgen.session.choice import Choice
    from specgen.session.memo import found_for
    from specgen.session.remembered import remembered_costs, remembered_rollbacks

    try:
        registry = Registry.load()
    except Exception:
        return []
    rows: list[PairFacts] = []
    for pair in registry.pairs.values():
        files = {role: cached(spec) for role, spec in pair.members()}
        downloaded = all(files.values())
        bench: dict[str, Any] = {}
        choice = Choice(pair.target, pair.draft, pair, pair.ngram, mtp=pair.mtp, head=pair.head)
        if downloaded:
            bench = found_for(choice)
        target = files.get("target")
        measured = remembered_rollbacks(target) if target else {}
        if isinstance(measured, dict) and measured.get("checkpoint"):
            measured["checkpoint_ms"] = (
                1000 * measured.get("checkpoint_seconds", 0.0) / measured["checkpoint"]
            )
        costs = remembered_costs(target, files.get("draft")) if downloaded and target else None
        host_share: dict[str, float] = {}
        for mode in ("greedy", "sampled"):
            timing = costs.of(mode == "greedy").host_share if costs else None
            if timing is not None and timing.weight:
                host_share[mode] = timing.mean
        rows.append(
            {
                "name": pair.name,
                "downloaded": downloaded,
                "host_share": host_share,
                "files": {r: str(p) if p else None for r, p in files.items()},
                "bench": bench,
                "draft_model": pair.draft is not None,
                "target_layout": _layout(target, pair.mtp) if target else None,
                "rollback": measured if isinstance(measured, dict) else {},
            }
        )
    return rows


def _layout(path: Path, mtp: bool) -> dict[str, Any] | None:
    """What a downloaded target is, from its header: attention or hybrid, MTP heads, MoE, how
    it rolls back with -k auto and the state memory that takes."""
    from specgen.lookahead import snapshots_for
    from specgen.models import arch, gguf

    try:
        found = arch.layout(gguf.read_local(str(path), tensors=True))
    except (OSError, gguf.GGUFError):
        return None
    return {
        **found.as_dict(snapshots_for("auto", mtp)),
        "few_active_experts": found.few_active_experts,
        "summary": found.describe(),
    }


def _worker_rows(rpc: str | None) -> list[dict[str, Any]]:
    """Each worker: its protocol, the best of three handshake round trips, its devices."""
    from specgen import backend
    from specgen.host import rpc as rpc_protocol
    from specgen.models.registry import Registry

    if rpc is None:
        try:
            named = [w for pair in Registry.load().pairs.values() for w in pair.workers]
        except Exception:
            named = []
    else:
        named = [str(e) for e in rpc_protocol.parse_endpoints(rpc)]
    rows = []
    for endpoint in dict.fromkeys(named):
        row: dict[str, Any] = {"endpoint": endpoint}
        try:
            hellos = [rpc_protocol.hello(rpc_protocol.parse_endpoint(endpoint)) for _ in range(3)]
            row["protocol"] = ".".join(map(str, hellos[0].version))
            row["round_trip_ms"] = min(h.round_trip_s for h in hellos) * 1000
            backend.require_rpc()
            row["devices"] = [vars(d) for d in backend.worker_devices(endpoint)]
        except Exception as error:  # every failure is a finding, not a crash
            row["error"] = str(error)
        rows.append(row)
    return rows


def _hub(timeout: float) -> dict[str, Any]:
    from huggingface_hub import constants

    endpoint = constants.ENDPOINT
    if constants.HF_HUB_OFFLINE:
        return {"endpoint": endpoint, "state": "offline mode (HF_HUB_OFFLINE=1)"}
    try:
        from huggingface_hub.utils import get_session

        response = get_session().head(endpoint, timeout=timeout, follow_redirects=True)
        state = f"reachable (HTTP {response.status_code})"
    except Exception as error:  # any network failure means: not reachable from here
        state = f"not reachable ({type(error).__name__})"
    return {"endpoint": endpoint, "state": state}
