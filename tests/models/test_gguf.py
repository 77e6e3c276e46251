"""specgen's own GGUF header reader against the GGUF project's writer (the `gguf` package that
llama.cpp's converters use): whatever metadata is written is read back; a cut or foreign file is
one clear error, never a crash."""

from __future__ import annotations

import math
from pathlib import Path

import gguf as gguf_writer
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specgen.models import gguf

KEYS = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=24)
SCALARS = st.one_of(
    st.integers(-(2**31), 2**31 - 1).map(lambda v: ("int32", v)),
    st.integers(0, 2**64 - 1).map(lambda v: ("uint64", v)),
    st.floats(width=32, allow_nan=False).map(lambda v: ("float32", v)),
    st.booleans().map(lambda v: ("bool", v)),
    st.text(max_size=40).map(lambda v: ("string", v)),
)
ARRAYS = st.one_of(
    st.lists(st.integers(-(2**31), 2**31 - 1), max_size=20).map(lambda v: ("int_array", v)),
    st.lists(st.text(max_size=8), max_size=20).map(lambda v: ("str_array", v)),
)


def write(
    path: Path, metadata: dict[str, tuple[str, object]], tokens: list[str] | None = None
) -> None:
    writer = gguf_writer.GGUFWriter(str(path), "llama")
    for key, (kind, value) in metadata.items():
        if kind == "int32":
            writer.add_int32(key, value)
        elif kind == "uint64":
            writer.add_uint64(key, value)
        elif kind == "float32":
            writer.add_float32(key, value)
        elif kind == "bool":
            writer.add_bool(key, value)
        elif kind == "string":
            writer.add_string(key, value)
        elif kind == "int_array":
            writer.add_array(key, [int(v) for v in value])  # type: ignore[attr-defined]
        else:
            writer.add_array(key, list(value))  # type: ignore[call-overload]
    if tokens is not None:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(tokens)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(metadata=st.dictionaries(KEYS, st.one_of(SCALARS, ARRAYS), max_size=8))
def test_what_the_writer_writes_the_reader_reads(tmp_path: Path, metadata) -> None:
    metadata = {k: v for k, v in metadata.items() if not k.startswith("general.")}
    path = tmp_path / "m.gguf"
    write(path, metadata)
    header = gguf.read_local(str(path))
    assert header.get("general.architecture") == "llama"
    # The same keys as the GGUF project's own reader finds (its writer leaves empty values out).
    theirs = {k for k in gguf_writer.GGUFReader(str(path)).fields if not k.startswith("GGUF.")}
    assert set(header.metadata) == theirs
    assert all(metadata[k][1] in ("", []) for k in set(metadata) - theirs)  # empties only
    metadata = {k: v for k, v in metadata.items() if k in theirs}
    for key, (kind, value) in metadata.items():
        found = header.get(key)
        if kind == "float32":
            assert math.isclose(found, value, rel_tol=1e-6, abs_tol=1e-30) or found == value
        elif kind == "int_array":
            assert found == value, key  # short arrays of numbers are kept (per-layer settings)
        elif kind.endswith("_array"):
            # other arrays are counted, not kept (only the vocabulary's tokens are kept whole)
            assert isinstance(found, gguf.ArrayInfo) and found.count == len(value)
        else:
            assert found == value, key


def test_tensor_names_are_read_as_the_gguf_project_reads_them(tmp_path: Path) -> None:
    from tests.tiny_models import write_qwen35

    path = write_qwen35(tmp_path / "m.gguf", mtp=True)
    header = gguf.read_local(str(path), tensors=True)
    theirs = [t.name for t in gguf_writer.GGUFReader(str(path)).tensors]
    assert header.tensors is not None and list(header.tensors) == theirs
    assert "blk.2.nextn.eh_proj.weight" in header.tensors


def test_a_vocabulary_is_read_from_the_header_alone(tmp_path: Path) -> None:
    path = tmp_path / "v.gguf"
    tokens = ["<unk>", "<s>", "</s>", *(f"tok{i}" for i in range(40))]
    write(path, {}, tokens)
    vocab = gguf.HeaderVocabulary(gguf.read_local(str(path)), "v.gguf")
    assert vocab.n_vocab == len(tokens) and vocab.token_text(5) == b"tok2"
    assert (vocab.bos, vocab.eos, vocab.vocab_type) == (1, 2, 2)  # BPE ("gpt2")
    assert not vocab.adds_bos and vocab.token_text(len(tokens)) == b""


@pytest.mark.parametrize("cut", [0, 3, 10, 30, 200])
def test_a_cut_file_is_one_clear_error(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "whole.gguf"
    write(path, {"some.key": ("string", "a value long enough to be cut" * 4)}, ["a", "b", "c"])
    data = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:cut])
    with pytest.raises(gguf.GGUFError, match="not a GGUF file|cut short"):
        gguf.read_local(str(tmp_path / "cut.gguf"))


@given(st.binary(max_size=300))
def test_no_bytes_make_the_reader_crash(data: bytes) -> None:
    import io

    try:
        gguf.read_header(io.BytesIO(b"GGUF" + data).read)
    except gguf.GGUFError:
        pass  # said as one line by the commands that read headers
