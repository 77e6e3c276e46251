"""Downloads with the real huggingface_hub client against a loopback Hub (tests.fake_hub)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.fake_hub import FakeHub
from tests.fakes import write_fake
from tests.invoke import one_line_error, specgen_popen, specgen_process

TARGET = os.urandom(300_000)
DRAFT = os.urandom(120_000)
# huggingface_hub writes a download in 10 MiB chunks, so only a larger file can be cut part-way.
BIG = os.urandom(25 * 1024 * 1024)
CHUNK = 10 * 1024 * 1024
BIG_PAIR = """
[pairs.big]
target = { repo = "org/big-GGUF", file = "big.gguf" }
draft = { repo = "org/tiny-GGUF", file = "draft.gguf" }
"""


@pytest.fixture
def hub():
    with FakeHub() as server:
        server.add(
            "org/tiny-GGUF", {"target.gguf": TARGET, "draft.gguf": DRAFT, "README.md": b"hi"}
        )
        yield server


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


def write_models(home: Path, text: str) -> None:
    (home / "models.toml").write_text(text)


TINY = """
[pairs.tiny]
description = "two tiny files"
target = { repo = "org/tiny-GGUF", file = "target.gguf" }
draft = { repo = "org/tiny-GGUF", file = "draft.gguf" }
"""


def specgen(
    args: list[str],
    hub: FakeHub,
    home: Path,
    offline: bool = False,
    token: str | None = None,
    wait: bool = True,
    fakes: bool = False,
):
    """``specgen ARGS`` in a process of its own against the loopback Hub, with ``home`` as its
    SPECGEN_HOME and the Hub's cache beside it (none of the caller's HF_ settings)."""
    env: dict[str, str | None] = {name: None for name in os.environ if name.startswith("HF_")}
    env.update(
        {
            "HF_ENDPOINT": hub.url,
            "HF_HOME": str(home.parent / "hf"),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_XET": "1",
            "NO_PROXY": "*",
            "SPECGEN_HOME": str(home),
            "SPECGEN_CACHE": str(home.parent / "cache"),
        }
    )
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    if token:
        env["HF_TOKEN"] = token
    if not wait:
        return specgen_popen(
            *args, env=env, fakes=fakes, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    return specgen_process(*args, env=env, fakes=fakes)


def repo_dir(home: Path, repo: str = "org/tiny-GGUF") -> Path:
    return home.parent / "hf" / "hub" / f"models--{repo.replace('/', '--')}"


def test_pull_fills_the_standard_cache(hub: FakeHub, home: Path) -> None:
    write_models(home, TINY)
    done = specgen(["models", "pull", "tiny"], hub, home)
    assert done.returncode == 0, done.stderr
    folder = repo_dir(home)
    commit = hub.repos["org/tiny-GGUF"].commit
    assert (folder / "refs" / "main").read_text() == commit
    for name, data in (("target.gguf", TARGET), ("draft.gguf", DRAFT)):
        link = folder / "snapshots" / commit / name
        assert link.is_symlink()
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        assert link.resolve() == blob.resolve() and blob.read_bytes() == data
    assert "downloading org/tiny-GGUF:target.gguf" in done.stderr  # not a terminal: one line


def test_second_pull_downloads_nothing(hub: FakeHub, home: Path) -> None:
    write_models(home, TINY)
    assert specgen(["models", "pull", "tiny"], hub, home).returncode == 0
    gets = len(hub.file_gets("target.gguf"))
    done = specgen(["models", "pull", "tiny"], hub, home)
    assert done.returncode == 0, done.stderr
    assert len(hub.file_gets("target.gguf")) == gets == 1
    assert "downloading" not in done.stderr


def test_cached_pair_works_when_the_hub_is_unreachable(hub: FakeHub, home: Path) -> None:
    write_models(home, TINY)
    assert specgen(["models", "pull", "tiny"], hub, home).returncode == 0
    hub.__exit__()  # the network is gone, but HF_HUB_OFFLINE is not set
    done = specgen(["models", "pull", "tiny"], hub, home)
    assert done.returncode == 0, done.stderr
    assert "ready target" in done.stderr


def test_missing_repo(hub: FakeHub, home: Path) -> None:
    broken = TINY.replace('"org/tiny-GGUF", file = "target', '"org/nope", file = "target')
    write_models(home, broken)
    one_line_error(
        specgen(["models", "pull", "tiny"], hub, home), "org/nope", "not found", progress=True
    )


def test_missing_file(hub: FakeHub, home: Path) -> None:
    write_models(home, TINY.replace("target.gguf", "Target.gguf"))
    one_line_error(
        specgen(["models", "pull", "tiny"], hub, home),
        "no file Target.gguf",
        "case-sensitive",
        progress=True,
    )


def test_gated_repo_needs_a_token(hub: FakeHub, home: Path) -> None:
    hub.repos["org/tiny-GGUF"].gated = True
    write_models(home, TINY)
    one_line_error(
        specgen(["models", "pull", "tiny"], hub, home),
        "gated",
        "HF_TOKEN",
        "huggingface.co/org/tiny-GGUF",
        progress=True,
    )
    done = specgen(["models", "pull", "tiny"], hub, home, token=hub.token)
    assert done.returncode == 0, done.stderr
    assert hub.file_gets("target.gguf")[-1].authorization == f"Bearer {hub.token}"


def test_dropped_connection_resumes_with_range(hub: FakeHub, home: Path) -> None:
    hub.add("org/big-GGUF", {"big.gguf": BIG})
    hub.cut_gets, hub.cut_after = 1, CHUNK + 1_000_000
    write_models(home, BIG_PAIR)
    done = specgen(["models", "pull", "big"], hub, home)
    assert done.returncode == 0, done.stderr
    ranges = [r.range for r in hub.file_gets("big.gguf")]
    assert ranges == [None, f"bytes={CHUNK}-"]
    commit = hub.repos["org/big-GGUF"].commit
    assert (repo_dir(home, "org/big-GGUF") / "snapshots" / commit / "big.gguf").read_bytes() == BIG


def stalled_pull(hub: FakeHub, home: Path) -> tuple[subprocess.Popen, list[Path]]:
    """`models pull` of a big file whose download stalls after its first chunk is on disk."""
    hub.add("org/big-GGUF", {"big.gguf": BIG})
    write_models(home, BIG_PAIR)
    hub.cut_after = CHUNK + 1_000_000
    hub.stall.set()
    proc = specgen(["models", "pull", "big"], hub, home, wait=False)
    blobs = repo_dir(home, "org/big-GGUF") / "blobs"
    deadline = time.monotonic() + 60
    partial: list[Path] = []
    while time.monotonic() < deadline and not partial:
        time.sleep(0.1)
        partial = (
            [p for p in blobs.glob("*.incomplete") if p.stat().st_size >= CHUNK]
            if blobs.is_dir()
            else []
        )
    assert partial, "the download never started"
    return proc, partial


def test_killed_download_leaves_no_corrupt_file_and_resumes(hub: FakeHub, home: Path) -> None:
    proc, partial = stalled_pull(hub, home)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    commit = hub.repos["org/big-GGUF"].commit
    final = repo_dir(home, "org/big-GGUF") / "snapshots" / commit / "big.gguf"
    assert not final.exists(), "a partial download sits where the complete file belongs"
    hub.stall.clear()
    done = specgen(["models", "pull", "big"], hub, home)
    assert done.returncode == 0, done.stderr
    assert final.read_bytes() == BIG
    assert [r.range for r in hub.file_gets("big.gguf")] == [None, f"bytes={CHUNK}-"]


def test_offline_mode(hub: FakeHub, home: Path) -> None:
    write_models(home, TINY + TINY.replace("tiny]", "other]").replace("tiny-GGUF", "other-GGUF"))
    hub.add("org/other-GGUF", {"target.gguf": b"x" * 10, "draft.gguf": b"y" * 10})
    assert specgen(["models", "pull", "tiny"], hub, home).returncode == 0
    before = len(hub.requests)
    done = specgen(["models", "pull", "tiny"], hub, home, offline=True)
    assert done.returncode == 0, done.stderr
    one_line_error(
        specgen(["models", "pull", "other"], hub, home, offline=True),
        "offline",
        "HF_HUB_OFFLINE",
        progress=True,
    )
    assert len(hub.requests) == before, "offline mode sent requests"


def test_globs_and_split_files(hub: FakeHub, home: Path) -> None:
    parts = {f"big-Q8_0-0000{i}-of-00003.gguf": bytes([i]) * 1000 for i in (1, 2, 3)}
    hub.add("org/split-GGUF", {**parts, "small-Q4_K_M.gguf": b"s" * 500, "README.md": b"r"})
    write_models(
        home,
        """
[pairs.split]
target = { repo = "org/split-GGUF", file = "*Q8_0*.gguf" }
draft = { repo = "org/split-GGUF", file = "*Q4_K_M.gguf" }
[pairs.ambiguous]
target = { repo = "org/split-GGUF", file = "*.gguf" }
draft = { repo = "org/split-GGUF", file = "small-Q4_K_M.gguf" }
""",
    )
    done = specgen(["models", "pull", "split"], hub, home)
    assert done.returncode == 0, done.stderr
    assert "big-Q8_0-00001-of-00003.gguf" in done.stderr
    snapshot = repo_dir(home, "org/split-GGUF") / "snapshots" / hub.repos["org/split-GGUF"].commit
    for name, data in parts.items():
        assert (snapshot / name).read_bytes() == data
    assert (snapshot / "small-Q4_K_M.gguf").is_file()
    listing = json.loads(specgen(["models", "list", "--json"], hub, home).stdout)
    split = next(p for p in listing if p["name"] == "split")
    assert split["target"]["cached"].endswith("big-Q8_0-00001-of-00003.gguf")
    one_line_error(
        specgen(["models", "pull", "ambiguous"], hub, home), "matches several", progress=True
    )


def test_sha256_mismatch_is_refused(hub: FakeHub, home: Path) -> None:
    good = hashlib.sha256(TARGET).hexdigest()
    write_models(
        home,
        TINY.replace('"target.gguf"', f'"target.gguf", sha256 = "{good}"').replace(
            '"draft.gguf"', f'"draft.gguf", sha256 = "{"0" * 64}"'
        ),
    )
    one_line_error(
        specgen(["models", "pull", "tiny"], hub, home), "sha256", "draft.gguf", progress=True
    )


def test_user_models_toml_overrides_builtin(hub: FakeHub, home: Path) -> None:
    write_models(
        home,
        'default = "qwen2.5-7b"\n'
        + TINY.replace("tiny]", '"qwen2.5-7b"]').replace("two tiny files", "mine"),
    )
    listing = json.loads(specgen(["models", "list", "--json"], hub, home).stdout)
    mine = next(p for p in listing if p["name"] == "qwen2.5-7b")
    assert mine["description"] == "mine" and mine["default"] is True
    assert mine["target"]["spec"] == "org/tiny-GGUF:target.gguf"
    assert mine["source"] == str(home / "models.toml")
    assert any(p["name"] == "qwen3-8b" for p in listing)  # built-in pairs are still there


def test_malformed_models_toml_names_the_line(hub: FakeHub, home: Path) -> None:
    write_models(home, '[pairs.x]\ntarget = { repo = "a/b", file = "c.gguf" \n')
    one_line_error(specgen(["models", "list"], hub, home), "models.toml", "line 2", progress=True)
    write_models(home, '# mine\n\n[pairs.broken]\ntarget = { path = "/x.gguf" }\n')
    one_line_error(specgen(["models", "list"], hub, home), "line 3", "has no draft", progress=True)
    write_models(
        home, '[pairs.k]\nlookahead = "six"\ntarget = { path = "a" }\ndraft = { path = "b" }\n'
    )
    one_line_error(specgen(["models", "list"], hub, home), "line 1", "lookahead", progress=True)


def test_run_a_pair_downloaded_from_the_hub(hub: FakeHub, home: Path, tmp_path: Path) -> None:
    """End to end: a pair that lives on the (loopback) Hub is downloaded, checked and run (a
    fake model's file, run on the fakes)."""
    data = write_fake(tmp_path / "fake.gguf").read_bytes()
    hub.add("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", {"smollm2-135m-instruct-q4_1.gguf": data})
    write_models(
        home,
        """
[pairs.hubpair]
chat = true
lookahead = 3
target = { repo = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", file = "*q4_1.gguf" }
[pairs.hubpair.draft]
repo = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
file = "smollm2-135m-instruct-q4_1.gguf"
""",
    )
    done = specgen(
        ["run", "--pair", "hubpair", "Say hello.", "-n", "8", "--json", "--temperature", "0"],
        hub,
        home,
        fakes=True,
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["pair"] == "hubpair" and record["params"]["chat"] is True
    assert record["text"] and record["stats"]["lookahead"] == 3
    assert len(hub.file_gets("smollm2-135m-instruct-q4_1.gguf")) == 1  # one blob, two roles


def test_list_shows_download_sizes_before_download(hub: FakeHub, home: Path) -> None:
    write_models(home, TINY)
    listing = json.loads(specgen(["models", "list", "--json"], hub, home).stdout)
    tiny = next(p for p in listing if p["name"] == "tiny")
    assert tiny["target"]["cached"] is None
    assert tiny["target"]["size_bytes"] == len(TARGET)
    assert tiny["draft"]["size_bytes"] == len(DRAFT)
    asked = len(hub.requests)
    specgen(["models", "list", "--json"], hub, home)
    assert len(hub.requests) == asked  # sizes are remembered
    table = specgen(["models", "list"], hub, home).stdout
    tiny = next(line for line in table.splitlines() if line.startswith("tiny "))
    assert "420 kB" in tiny and tiny.split()[-1] == "no"


# -- paths on stdout, Ctrl-C, a full disk, no network, headers read by ranges ------------------


def test_pull_prints_the_paths_on_stdout(hub: FakeHub, home: Path) -> None:
    write_models(home, TINY)
    done = specgen(["models", "pull", "tiny"], hub, home)
    assert done.returncode == 0, done.stderr
    paths = [Path(line) for line in done.stdout.splitlines()]
    assert [p.name for p in paths] == ["target.gguf", "draft.gguf"]
    assert paths[0].read_bytes() == TARGET and paths[1].read_bytes() == DRAFT


def test_ctrl_c_while_downloading_keeps_a_resumable_partial(hub: FakeHub, home: Path) -> None:
    proc, partial = stalled_pull(hub, home)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "interrupted"
    assert out == ""
    commit = hub.repos["org/big-GGUF"].commit
    final = repo_dir(home, "org/big-GGUF") / "snapshots" / commit / "big.gguf"
    assert not final.exists() and partial[0].exists()
    hub.stall.clear()
    done = specgen(["models", "pull", "big"], hub, home)
    assert done.returncode == 0, done.stderr
    assert final.read_bytes() == BIG
    assert [r.range for r in hub.file_gets("big.gguf")] == [None, f"bytes={CHUNK}-"]


def test_a_full_disk_while_downloading(
    hub: FakeHub, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from huggingface_hub import constants, file_download

    from specgen.errors import UserError
    from specgen.models import hub as specgen_hub

    hub.add("org/big-GGUF", {"big.gguf": BIG})
    cache = home.parent / "hf" / "hub"
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(
        constants,
        "HUGGINGFACE_CO_URL_TEMPLATE",
        hub.url + "/{repo_id}/resolve/{revision}/{filename}",
    )

    def http_get(url: str, temp_file, **kwargs) -> None:
        temp_file.write(BIG[:1000])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(file_download, "http_get", http_get)
    with pytest.raises(UserError, match="disk is full") as caught:
        specgen_hub.download("org/big-GGUF", "big.gguf", progress=False)
    assert "resumes" in str(caught.value)
    blobs = cache / "models--org--big-GGUF" / "blobs"
    (partial,) = blobs.glob("*.incomplete")
    assert partial.stat().st_size == 1000  # kept, to resume from
    assert [p for p in blobs.iterdir() if not p.name.endswith(".incomplete")] == []
    assert not (cache / "models--org--big-GGUF" / "snapshots").exists()


def test_no_network_and_nothing_cached(hub: FakeHub, home: Path) -> None:
    write_models(home, TINY)
    hub.__exit__()
    one_line_error(
        specgen(["models", "pull", "tiny"], hub, home),
        "could not reach the Hub",
        "HF_ENDPOINT",
        progress=True,
    )


def gguf_bytes(tokens: list[str], file_type: int = 15, padding: int = 0) -> bytes:
    """A small GGUF: a real header (metadata and vocabulary) and ``padding`` bytes of weights."""
    import struct

    def string(text: str) -> bytes:
        data = text.encode()
        return struct.pack("<Q", len(data)) + data

    items = [
        ("general.architecture", 8, string("llama")),
        ("general.name", 8, string("Tiny")),
        ("general.file_type", 4, struct.pack("<I", file_type)),
        ("llama.context_length", 4, struct.pack("<I", 8192)),
        ("tokenizer.ggml.model", 8, string("gpt2")),
        ("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 1)),
        ("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 2)),
        ("tokenizer.chat_template", 8, string("{{ messages }}")),
        (
            "tokenizer.ggml.tokens",
            9,
            struct.pack("<IQ", 8, len(tokens)) + b"".join(string(t) for t in tokens),
        ),
    ]
    body = b"".join(string(key) + struct.pack("<I", kind) + value for key, kind, value in items)
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(items)) + body + os.urandom(padding)


def test_info_and_check_read_only_the_header_of_a_hub_file(hub: FakeHub, home: Path) -> None:
    tokens = [f"tok{i}" for i in range(20_000)]
    big = gguf_bytes(tokens, padding=30 * 1024 * 1024)
    hub.add(
        "org/llm-GGUF",
        {
            "target.gguf": big,
            "draft.gguf": gguf_bytes(tokens, file_type=7, padding=1000),
            "other.gguf": gguf_bytes(tokens[:100] + ["x"] + tokens[101:], padding=1000),
        },
    )
    done = specgen(["models", "info", "org/llm-GGUF:target.gguf", "--json"], hub, home)
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["quantization"] == "Q4_K_M" and facts["vocab_size"] == 20_000
    assert facts["context_length"] == 8192 and facts["chat_template"] is True
    assert facts["size_bytes"] == len(big) and facts["bos"]["text"] == "tok1"
    assert "read the header" in done.stderr and "nothing downloaded" in done.stderr
    gets = hub.file_gets("target.gguf")
    assert gets and all(r.range and r.range.startswith("bytes=") for r in gets)
    served = sum(int(r.range[6:].split("-")[1]) - int(r.range[6:].split("-")[0]) + 1 for r in gets)
    assert served <= 2 * 1024 * 1024  # a couple of megabytes of a 30 MB file
    assert not list((home.parent / "hf").rglob("*.gguf"))  # nothing in the cache
    ok = specgen(
        [
            "models",
            "check",
            "--target",
            "org/llm-GGUF:target.gguf",
            "--draft",
            "org/llm-GGUF:draft.gguf",
        ],
        hub,
        home,
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok these models: draft draft.gguf fits target target.gguf")
    bad = specgen(
        [
            "models",
            "check",
            "--target",
            "org/llm-GGUF:target.gguf",
            "--draft",
            "org/llm-GGUF:other.gguf",
        ],
        hub,
        home,
    )
    one_line_error(bad, "cannot serve", "token 100 differs", progress=True)


def test_a_2026_pair_resolves_to_its_pinned_hub_file(hub: FakeHub, home: Path, tmp_path) -> None:
    """qwen3.6-27b-mtp names unsloth's MTP repo at a revision, with a sha256: the same file
    name has other bytes in the repo without the MTP block. Against a loopback Hub holding a
    tiny qwen35 with an MTP block under that name: its header is read from the pinned revision
    and shows the head; pulling it refuses bytes that are not the pinned ones."""
    from specgen.models.registry import Registry
    from tests.tiny_models import write_qwen35

    spec = Registry.load().pairs["qwen3.6-27b-mtp"].target
    tiny = write_qwen35(tmp_path / "tiny.gguf", mtp=True).read_bytes()
    hub.add(spec.repo, {spec.file: tiny})
    done = specgen(["models", "info", "qwen3.6-27b-mtp:target", "--json"], hub, home)
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["architecture"] == "qwen35" and facts["mtp_heads"] == 1
    assert any(f"/resolve/{spec.revision}/{spec.file}" in r.path for r in hub.requests)
    check = specgen(["models", "check", "qwen3.6-27b-mtp"], hub, home)
    assert check.returncode == 0 and "drafts with its own MTP head" in check.stdout
    one_line_error(
        specgen(["models", "pull", "qwen3.6-27b-mtp"], hub, home), "sha256", progress=True
    )


def test_models_rm_frees_a_pairs_files_after_asking(hub: FakeHub, home: Path) -> None:
    write_models(home, TINY)
    assert specgen(["models", "pull", "tiny"], hub, home).returncode == 0
    blobs = repo_dir(home) / "blobs"
    assert len(list(blobs.iterdir())) == 2
    asked = specgen(["models", "rm", "tiny"], hub, home)  # stdin is not a terminal: no asking
    assert asked.returncode == 2 and "add --yes" in asked.stderr
    assert len(list(blobs.iterdir())) == 2  # nothing deleted without a yes
    one = specgen(["models", "rm", "tiny:draft", "--yes"], hub, home)
    assert one.returncode == 0, one.stderr
    assert "freed 120 kB" in one.stderr and len(list(blobs.iterdir())) == 1
    both = specgen(["models", "rm", "tiny", "-y"], hub, home)
    assert both.returncode == 0 and "deleted 1 file," in both.stderr, both.stderr
    assert not list(blobs.iterdir())
    listing = json.loads(specgen(["models", "list", "--json"], hub, home, offline=True).stdout)
    tiny = next(p for p in listing if p["name"] == "tiny")
    assert tiny["target"]["cached"] is None and tiny["draft"]["cached"] is None
    again = specgen(["models", "rm", "tiny", "-y"], hub, home)
    assert again.returncode == 0 and "nothing of these is downloaded" in again.stderr
    assert specgen(["models", "pull", "tiny"], hub, home).returncode == 0  # and it comes back


def test_models_clean_frees_leftovers_and_conversions(hub: FakeHub, home: Path) -> None:
    write_models(home, TINY)
    assert specgen(["models", "pull", "tiny"], hub, home).returncode == 0
    cache = home.parent / "cache"
    leftover = cache / "derived" / "abc" / "model.F32.gguf.123.partial"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(bytes(5000))
    converted = cache / "derived" / "abc" / "model.F32.gguf"
    converted.write_bytes(bytes(3000))
    done = specgen(["models", "clean", "--yes"], hub, home)
    assert done.returncode == 0, done.stderr
    assert "freed 8 kB" in done.stderr and not leftover.exists() and not converted.exists()
    assert len(list((repo_dir(home) / "blobs").iterdir())) == 2  # downloads stay
    assert "nothing to clean" in specgen(["models", "clean", "--yes"], hub, home).stderr
    everything = specgen(["models", "clean", "--all", "--yes"], hub, home)
    assert everything.returncode == 0 and "freed 420 kB" in everything.stderr
    assert not list((repo_dir(home) / "blobs").iterdir())
