"""The memory check before ``--parallel N`` loads: N contexts of each model must fit beside the
weights in the memory free, or one line says what they need."""

from __future__ import annotations

from pathlib import Path

import pytest

from specgen.errors import EXIT_FAILED, UserError
from specgen.host import machine
from specgen.models import arch, gguf
from specgen.session.fit import auto_parallel, check_parallel_memory
from tests.conftest import FakePair
from tests.invoke import one_line_error, specgen_here
from tests.tiny_models import write_header

# SmolLM2 135M's shape: 30 layers, 9 heads of 64, 3 of them for keys and values.
SMOL = {
    "llama.block_count": 30,
    "llama.embedding_length": 576,
    "llama.attention.head_count": 9,
    "llama.attention.head_count_kv": 3,
    "llama.context_length": 8192,
}
PER_TOKEN = 30 * 3 * (64 + 64) * 2  # bytes: layers x kv heads x (key + value) x F16


@pytest.fixture
def smol_shaped(tmp_path: Path) -> tuple[Path, Path]:
    tokens = [f"t{i}" for i in range(32)]
    target = write_header(tmp_path / "target.gguf", "llama", tokens, metadata=SMOL)
    draft = write_header(tmp_path / "draft.gguf", "llama", tokens, metadata=SMOL)
    return target, draft


def test_the_cache_per_token_is_read_from_the_header(smol_shaped: tuple[Path, Path]) -> None:
    header = gguf.read_local(str(smol_shaped[0]))
    assert arch.kv_bytes_per_token(header) == PER_TOKEN


def test_contexts_that_do_not_fit_are_refused_before_loading(
    smol_shaped: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    models = [(p, gguf.read_local(str(p), tensors=True)) for p in smol_shaped]
    need = 2 * 4 * 4096 * PER_TOKEN  # two models, four contexts of the default 4096 tokens
    monkeypatch.setattr(machine, "available_memory", lambda: need // 2)
    with pytest.raises(UserError, match=r"--parallel 4 needs about 0\.7 GiB .* 4 contexts of 4096"):
        check_parallel_memory(models, 0, 4)
    check_parallel_memory(models, 1024, 4)  # a quarter of the context fits
    check_parallel_memory(models, 0, 1)  # one sequence is never refused here
    monkeypatch.setattr(machine, "available_memory", lambda: 2 * need)
    check_parallel_memory(models, 0, 4)


def test_run_parallel_says_so_in_one_line(
    smol_shaped: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(machine, "available_memory", lambda: 10 * 2**20)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    target, draft = smol_shaped
    done = specgen_here(
        "run", "-f", str(prompts), "--target", str(target), "--draft", str(draft),
        "--parallel", "8",
    )  # fmt: skip
    one_line_error(done, "--parallel 8 needs about", "lower --parallel or --ctx-size",
                   code=EXIT_FAILED)  # fmt: skip


def test_nobody_choosing_takes_llama_servers_slots_where_their_contexts_fit(
    smol_shaped: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server's slots (a file's prompts at once) where nobody chose and nothing was measured:
    4, as llama-server's ``-np`` auto, or as many below it as fit beside the weights."""
    models = [(p, gguf.read_local(str(p), tensors=True)) for p in smol_shaped]
    weights = sum(p.stat().st_size for p in smol_shaped)

    def need(n: int) -> int:  # two models, n contexts of the default 4096 tokens
        return weights + 2 * n * 4096 * PER_TOKEN

    for free, slots in [(need(4), 4), (need(3) - 1, 2), (need(2), 2), (need(2) - 1, 1)]:
        monkeypatch.setattr(machine, "available_memory", lambda free=free: free)
        parallel, note = auto_parallel(models, 0)
        assert parallel == slots, (free, parallel)
        assert (f"--parallel {slots}" if slots > 1 else "one at a time") in note
        assert ("as many as fit" in note) == (1 < slots < 4)
    monkeypatch.setattr(machine, "available_memory", lambda: need(2))
    assert auto_parallel(models, 1024)[0] == 4  # a quarter of the context


def test_nobody_choosing_runs_one_at_a_time_off_this_cpu_or_for_a_recurrent_target(
    smol_shaped: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU's memory is not read before loading, and a recurrent target with several
    sequences copies its state every cycle, which a lone request would pay too: one slot, and
    the note says how to choose."""
    monkeypatch.setattr(machine, "available_memory", lambda: 2**40)
    models = [(p, gguf.read_local(str(p), tensors=True)) for p in smol_shaped]
    for elsewhere in ("on a GPU", "on workers"):
        parallel, note = auto_parallel(models, 0, elsewhere)
        assert parallel == 1 and elsewhere in note and "--parallel N" in note
    tokens = [f"t{i}" for i in range(32)]
    mamba = write_header(
        tmp_path / "mamba.gguf", "mamba", tokens, metadata={"mamba.block_count": 4}
    )
    parallel, note = auto_parallel([(mamba, gguf.read_local(str(mamba)))], 0)
    assert parallel == 1 and "a recurrent target" in note


def test_serve_and_a_file_of_prompts_take_the_slots_nobody_chose(
    fake_pair: FakePair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``parallel="auto"`` (what ``serve`` and ``run -f`` pass where --parallel is not given)
    takes 4 on this CPU; the library's own default stays one; what ``bench --streams``
    measured here comes first."""
    from specgen.api import Specgen
    from specgen.session import memo

    monkeypatch.setattr(machine, "available_memory", lambda: 2**40)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c"}\n')
    files = ("--target", str(fake_pair.target), "--draft", str(fake_pair.draft))

    def run_file() -> str:
        done = specgen_here("run", "-f", str(prompts), *files, "-n", "4")
        assert done.returncode == 0, done.stderr
        assert len(done.stdout.splitlines()) == 3
        return done.stderr

    assert "--parallel 3: one for each prompt to run" in run_file()
    auto = Specgen(target=fake_pair.target, draft=fake_pair.draft, threads=2, parallel="auto")
    assert auto.parallel == 4 and auto.pair.parallel == 4 and "--parallel 4" in auto.note
    plain = Specgen(target=fake_pair.target, draft=fake_pair.draft, threads=2, parallel=None)
    assert plain.parallel == 1
    memo.remember_streams(auto.decision.memo, 2, 60.0, "2026-12-06")
    measured = Specgen(target=fake_pair.target, draft=fake_pair.draft, threads=2, parallel="auto")
    assert measured.parallel == 2 and "bench --streams" in measured.note
    assert "--parallel 2: what `specgen bench --streams` found best" in run_file()


def test_a_file_of_few_prompts_makes_no_context_it_will_not_use(
    fake_pair: FakePair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each sequence holds its contexts' memory whether it generates or not: a file of fewer
    prompts than the slots nobody chose (or than ``bench --streams`` measured) runs a sequence
    for each of those it will generate for, counting neither bad lines nor those ``--resume``
    skips; a count given with --parallel is taken as given."""
    from dataclasses import replace

    from specgen.api import Specgen
    from specgen.session import memo, pair

    made: list[int] = []
    backend = pair.BACKEND

    def load(path: Path, options: object, verbose: bool) -> object:
        made.append(options.n_seq)  # type: ignore[attr-defined]
        return backend.load(path, options, verbose)  # type: ignore[arg-type]

    monkeypatch.setattr(pair, "BACKEND", replace(backend, load=load))
    monkeypatch.setattr(machine, "available_memory", lambda: 2**40)
    files = ("--target", str(fake_pair.target), "--draft", str(fake_pair.draft), "-n", "4")
    prompts, output = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"

    def run_file(*more: str, code: int = 0) -> str:
        made.clear()
        done = specgen_here("run", "-f", str(prompts), *files, *more)
        assert done.returncode == code, done.stderr
        return done.stderr

    prompts.write_text('{"id": "a", "prompt": "a"}\n')
    assert "one at a time: one prompt to run" in run_file() and made == [1, 1]
    prompts.write_text('{"id": "a", "prompt": "a"}\n{not json\n{"id": "b", "prompt": "b"}\n')
    err = run_file("-o", str(output), code=EXIT_FAILED)  # the bad line's error
    assert "--parallel 2: one for each prompt to run" in err and made == [2, 2]
    prompts.write_text(prompts.read_text() + '{"id": "c", "prompt": "c"}\n')
    err = run_file("-o", str(output), "--resume", code=EXIT_FAILED)  # a and b done: c alone
    assert "one at a time: one prompt to run" in err and made == [1, 1]
    err = run_file("-o", str(output), "--resume", code=EXIT_FAILED)  # all done: none to run
    assert "no prompt to run" in err and made == [1, 1]
    run_file("--parallel", "4", code=EXIT_FAILED)
    assert made == [4, 4]
    prompts.write_text("".join(f'{{"prompt": "p{i}"}}\n' for i in range(5)))
    assert "--parallel 4: llama-server's slots" in run_file() and made == [4, 4]
    each_line = tmp_path / "prompts.txt"
    each_line.write_text("one\ntwo\n")
    made.clear()
    done = specgen_here("run", "-f", str(each_line), "--each-line", *files)
    assert done.returncode == 0 and made == [2, 2], done.stderr
    auto = Specgen(target=fake_pair.target, draft=fake_pair.draft, parallel="auto", prompts=3)
    assert auto.parallel == 3 and "--parallel 3: one for each prompt to run" in auto.note
    memo.remember_streams(auto.decision.memo, 4, 60.0, "2026-12-07")  # bench measured 4
    measured = Specgen(target=fake_pair.target, draft=fake_pair.draft, parallel="auto", prompts=2)
    assert measured.parallel == 2 and "found best here" in measured.note
    assert "; 2 for the 2 prompts to run" in measured.note


def test_the_slots_nobody_chose_are_what_the_pair_loads(
    fake_pair: FakePair, smol_shaped: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The count the rule takes is the one every context is made with, and the one the API and
    its note report: lowered to what fits (the fakes read as SmolLM2-shaped headers), and one
    where this build would put the layers on a GPU."""
    from dataclasses import replace

    from specgen.api import Specgen
    from specgen.session import pair

    loaded: list[int] = []
    backend = pair.BACKEND

    def load(path: Path, options: object, verbose: bool) -> object:
        loaded.append(options.n_seq)  # type: ignore[attr-defined]
        return backend.load(path, options, verbose)  # type: ignore[arg-type]

    header = gguf.read_local(str(smol_shaped[0]), tensors=True)
    monkeypatch.setattr(pair, "header_of", lambda path: header)
    weights = fake_pair.target.stat().st_size + fake_pair.draft.stat().st_size
    need_two = weights + 2 * 2 * 4096 * PER_TOKEN
    monkeypatch.setattr(machine, "available_memory", lambda: need_two)
    monkeypatch.setattr(pair, "BACKEND", replace(backend, load=load))
    two = Specgen(target=fake_pair.target, draft=fake_pair.draft, parallel="auto")
    assert loaded == [2, 2] and two.parallel == two.pair.parallel == 2
    assert "--parallel 2: llama-server's slots, as many as fit" in two.note
    loaded.clear()
    monkeypatch.setattr(pair, "BACKEND", replace(backend, load=load, gpu_offload=lambda: True))
    gpu = Specgen(target=fake_pair.target, draft=fake_pair.draft, parallel="auto")
    assert loaded == [1, 1] and gpu.parallel == 1 and "models on a GPU" in gpu.note
    cpu = Specgen(target=fake_pair.target, draft=fake_pair.draft, parallel="auto", gpu_layers=0)
    assert cpu.parallel == 2  # every layer on this CPU: its memory decides
