"""Whether model files may be loaded, and whether a draft fits its target: from the GGUF
headers before llama.cpp sees the files (some make it abort the process), and from the loaded
vocabularies after (the verdict cached per file pair)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from specgen.errors import UserError
from specgen.host import machine, store
from specgen.models import arch, compat, gguf


class ModelFile(compat.VocabView, Protocol):
    """A loaded model's vocabulary and the file it came from."""

    path: Path


def check_fit(target: ModelFile, draft: ModelFile) -> None:
    """Refuse a draft whose vocabulary, as llama.cpp reads it, does not fit the target (the
    result cached per file pair)."""
    stamp = _fit_stamp(target.path, draft.path)
    if stamp.is_file():
        return
    verdict = compat.check(target, draft)
    if not verdict:
        raise UserError(unfit(verdict, target.path.name, draft.path.name))
    store.write_text(stamp, f"{target.path}\n{draft.path}\n")  # read-only: check next time


def check_headers_fit(
    target: Path, draft: Path, headers: tuple[gguf.Header | None, gguf.Header | None]
) -> None:
    """The vocabulary check on the two files' headers (``header_of``), before any weights
    load (a 27B target and its draft take a while to load only to be refused), with the
    families' own advice."""
    if _fit_stamp(target, draft).is_file():
        return
    target_header, draft_header = headers
    if target_header is None or draft_header is None:
        return  # llama.cpp reads it, or fails on it, when it loads
    try:
        vocabs = (
            gguf.HeaderVocabulary(target_header, target.name),
            gguf.HeaderVocabulary(draft_header, draft.name),
        )
    except gguf.GGUFError:
        return
    verdict = compat.check(*vocabs)
    if not verdict:
        t_arch, d_arch = (
            str(h.get("general.architecture") or "") for h in (target_header, draft_header)
        )
        step = compat.advice(verdict, t_arch, d_arch, vocabs[0], vocabs[1])
        raise UserError(unfit(verdict, target.name, draft.name, step))


def check_head(
    target: Path,
    target_header: gguf.Header | None,
    head: Path,
    head_header: gguf.Header | None,
    asked: str | None = None,
) -> str | None:
    """The kind of head the draft file is (``eagle3``, ``dflash``; None: a draft model), from
    its header, refused in one line where it cannot draft for this target: another kind than
    ``asked`` (``--draft eagle3:FILE``), a kind not run yet, layers or widths the target does
    not have, another vocabulary. All before any weights load."""
    found = arch.head_layout(head_header) if head_header is not None else None
    forked = head_header.get("general.architecture") if head_header is not None else None
    if forked in arch.FORK_HEAD_ARCHS:
        raise UserError(
            f"{head.name} is {arch.FORK_HEAD_ARCHS[forked]}, which llama.cpp itself does not "
            f"read: convert the head's checkpoint with llama.cpp's convert_hf_to_gguf.py "
            f"--target-model-dir TARGET (it writes the eagle3 or dflash architecture)"
        )
    if asked is not None and (found is None or found.kind != asked):
        if head_header is None:
            return asked  # llama.cpp reads it, or fails on it, when it loads
        if found is not None:
            raise UserError(
                f"{head.name} is {arch.HEAD_NAMES[found.kind]}, not {arch.HEAD_NAMES[asked]}: "
                f"write {found.kind}:{head.name}, or the file alone"
            )
        what = head_header.get("general.architecture") or "unknown"
        raise UserError(
            f"{head.name} is a {what} model, not {arch.HEAD_NAMES[asked]}: drop the "
            f"'{asked}:' before it to draft with it as a model"
        )
    if found is None or target_header is None:
        return None if found is None else found.kind
    problem = arch.head_problem(found, target_header)
    if problem:
        raise UserError(f"head {head.name} cannot draft for target {target.name}: {problem}")
    check_headers_fit(target, head, (target_header, head_header))
    return found.kind


def unfit(verdict: compat.Fit, target: str, draft: str, advice: str = "") -> str:
    """What a draft that does not fit its target says: why, and what to do."""
    step = advice or "pick a draft from the target's model family"
    return f"draft {draft} cannot serve target {target}: {verdict.reason}; {step}"


def _fit_stamp(target: Path, draft: Path) -> Path:
    return store.path("compat", store.file_key(target, draft), suffix="")


def header_of(path: Path) -> gguf.Header | None:
    """A file's GGUF header with its tensor names, read once for every check before loading;
    None where it cannot be read (llama.cpp then fails on the file with an error)."""
    try:
        return gguf.read_local(str(path), tensors=True)
    except (OSError, gguf.GGUFError):
        return None


def check_loadable(path: Path, header: gguf.Header | None, role: str, mtp: bool) -> None:
    """Refuse, from its header, a file that would make llama.cpp abort the process, and an MTP
    head asked of a target without one. A file whose header cannot be read is left to
    llama.cpp, which fails on it with an error, not an abort."""
    if header is None:
        if mtp:
            raise UserError(f"{path.name}: cannot read its GGUF header to find its MTP layers")
        return
    found = arch.layout(header)
    if mtp and found.mtp_layers == 0:
        raise UserError(
            f"{path.name} has no MTP layers (no tensor blk.N.nextn.eh_proj.weight) to draft "
            f"with; give a --draft model, or --draft ngram"
        )
    if role == "draft" and "assistant" in found.architecture:
        raise UserError(
            f"{path.name} is a {found.architecture} drafter, which shares the target's cache; "
            f"llama-cpp-python cannot drive that yet: draft with a small model of the family "
            f"(Gemma 4 E2B), or --draft ngram"
        )
    problem = arch.load_problem(found, mtp)
    if problem:
        raise UserError(f"{role} {path.name}: {problem}")


# Sequences a server or a file of prompts runs at once where nobody chose and ``bench
# --streams`` never measured these models here: llama-server's slots (its ``-np`` auto).
AUTO_PARALLEL = 4


def check_parallel_memory(
    models: list[tuple[Path, gguf.Header | None]], n_ctx: int, parallel: int
) -> None:
    """Refuse, before loading, ``parallel`` sequences whose contexts (each model's cache of
    ``n_ctx`` tokens a sequence, and its recurrent state) do not fit beside the weights in the
    memory free now. ``n_ctx`` 0: the target's training context, at most 4096 (the backend's
    default). Headers that cannot be read, or a system that does not say what is free, pass."""
    if parallel <= 1:
        return
    memory = _memory(models, n_ctx)
    if memory is None:
        return
    weights, per_sequence, available, n_ctx = memory
    contexts = parallel * per_sequence
    if weights + contexts > available:
        raise UserError(
            f"--parallel {parallel} needs about {_gib(weights + contexts)} of memory (the "
            f"weights {_gib(weights)}, {parallel} contexts of {n_ctx} tokens "
            f"{_gib(contexts)}) and {_gib(available)} is free: lower --parallel or --ctx-size"
        )


def auto_parallel(
    models: list[tuple[Path, gguf.Header | None]],
    n_ctx: int,
    elsewhere: str = "",
    most: int = AUTO_PARALLEL,
) -> tuple[int, str]:
    """Sequences at once where nobody chose (a server's slots, a file's prompts), and a note
    that says why: AUTO_PARALLEL, or as many below it as fit in the memory free now (not
    checked where the system does not say or a header cannot be read), and no more than
    ``most`` (a file's prompts to run: a sequence that never generates holds its contexts'
    memory all the same); one for a target with recurrent state (with several sequences each
    cycle copies its state, which a single stream then pays too), or for models ``elsewhere``
    than this CPU's memory ("on a GPU", "on workers": theirs is not read before loading)."""
    header = models[0][1]
    kind = arch.layout(header).kind if header is not None else "attention"
    choose = "(--parallel N to choose, `specgen bench --streams` to measure)"
    if kind != "attention":
        return (
            1,
            f"one at a time: a {kind} target copies its state each cycle with several {choose}",
        )
    if elsewhere:
        return 1, f"one at a time: models {elsewhere}, whose memory is not read here {choose}"
    if most < 2:
        return 1, "one at a time: one prompt to run"
    memory = _memory(models, n_ctx)
    fits = AUTO_PARALLEL
    if memory is not None:
        weights, per_sequence, available, _ = memory
        fits = min(AUTO_PARALLEL, (available - weights) // max(1, per_sequence))
    if fits < 2:
        return (
            1,
            "one at a time: two contexts do not fit in the memory free (--parallel N to choose)",
        )
    if most < fits:
        return most, f"--parallel {most}: one for each prompt to run {choose}"
    fewer = "" if fits == AUTO_PARALLEL else ", as many as fit in the memory free"
    return fits, f"--parallel {fits}: llama-server's slots{fewer} {choose}"


def _memory(
    models: list[tuple[Path, gguf.Header | None]], n_ctx: int
) -> tuple[int, int, int, int] | None:
    """The bytes of the weights, of one sequence's contexts (each model's cache of ``n_ctx``
    tokens and its recurrent state), and free now, and the context's tokens a sequence; None
    where the system does not say what is free or a header cannot be read."""
    available = machine.available_memory()
    headers = [h for _, h in models]
    if available is None or any(h is None for h in headers):
        return None
    if not n_ctx:
        first = headers[0]
        assert first is not None
        trained = first.get(f"{first.get('general.architecture')}.context_length")
        n_ctx = min(4096, trained) if isinstance(trained, int) and trained > 0 else 4096
    weights = sum(path.stat().st_size for path, _ in models)
    per_sequence = 0
    for _, header in models:
        assert header is not None
        state = arch.layout(header).state_bytes or 0
        per_sequence += n_ctx * arch.kv_bytes_per_token(header) + state
    return weights, per_sequence, available, n_ctx


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"
