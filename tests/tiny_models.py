"""Tiny random-weight GGUFs of 2026 architectures, written at test time with the ``gguf`` package.

No 2026 weights can be downloaded here, so the hybrid (Gated-DeltaNet + attention) and MTP code
paths run on models these functions write: ``qwen35`` is the architecture of Qwen3.5 / 3.6 / 3.8.
Layout and metadata keys follow llama.cpp's own test fixture (``tests/test-llama-archs.cpp``):
a trunk of DeltaNet and attention layers (layer i is attention when ``(i + 1) % interval == 0``)
and, with ``mtp=True``, one appended next-token (nextn / MTP) block. The embeddings and the output
layer are scaled up so greedy choices have clear margins (no near-ties that batched and one-row
decodes would break differently). Nothing here is committed: the files are written into a test's
temporary folder (or a cache folder the caller names), from a seed, so every run has the same
bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Qwen35Shape:
    """The shape of a synthetic qwen35. The defaults are the tiny test model (8 MB at F32);
    ``REALISTIC`` is the benchmark's (n_embd 1024, 8 trunk layers of which 6 DeltaNet, 32k
    vocabulary, one MTP block)."""

    n_vocab: int = 128
    n_embd: int = 256
    n_head: int = 2
    n_ff: int = 384
    n_trunk: int = 2
    interval: int = 2  # every interval-th layer is full attention; 1: all attention (no DeltaNet)
    d_state: int = 128
    dt_rank: int = 2
    n_group: int = 2
    n_ctx_train: int = 512
    nextn_layers: int = 1  # MTP blocks written when mtp=True (llama.cpp's qwen35 asserts 1)


TINY = Qwen35Shape()
REALISTIC = Qwen35Shape(
    n_vocab=32768,
    n_embd=1024,
    n_head=8,
    n_ff=2816,
    n_trunk=8,
    interval=4,
    d_state=128,
    dt_rank=8,
    n_group=4,
    n_ctx_train=4096,
)


def write_qwen35(
    path: Path,
    shape: Qwen35Shape = TINY,
    *,
    mtp: bool = False,
    seed: int = 0,
    output_scale: float = 0.5,
) -> Path:
    """Write a random qwen35 GGUF at ``path`` and return it.

    ``seed`` picks the weights: two files of one shape with different seeds share the vocabulary
    (a hybrid draft for a hybrid target).
    """
    import gguf

    rng = np.random.default_rng(seed)
    s = shape
    head_dim = s.n_embd // s.n_head
    n_nextn = s.nextn_layers if mtp else 0
    d_inner = s.d_state * s.dt_rank
    key_dim, value_dim = s.d_state * s.n_group, s.d_state * s.dt_rank
    conv_dim = 2 * key_dim + value_dim
    d_conv = 4

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "qwen35")
    w.add_name(f"tiny-qwen35-{'mtp-' if mtp else ''}s{seed}")
    w.add_context_length(s.n_ctx_train)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_trunk + n_nextn)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_sections([head_dim // 4] * 4)
    w.add_full_attention_interval(s.interval)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(s.d_state)
    w.add_ssm_time_step_rank(s.dt_rank)
    w.add_ssm_group_count(s.n_group)
    if n_nextn:
        w.add_nextn_predict_layers(n_nextn)
    w.add_vocab_size(s.n_vocab)
    w.add_tokenizer_model("test")
    w.add_token_list([f"tok_{i}" for i in range(s.n_vocab)])
    w.add_token_scores([0.0] * s.n_vocab)
    w.add_file_type(0)  # all F32

    def rnd(*dims: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(dims) * scale).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones((n,), dtype=np.float32)

    # numpy shapes are ggml's ne reversed
    w.add_tensor("token_embd.weight", rnd(s.n_vocab, s.n_embd, scale=0.5))
    w.add_tensor("output_norm.weight", ones(s.n_embd))
    w.add_tensor("output.weight", rnd(s.n_vocab, s.n_embd, scale=output_scale))

    def ffn(il: int) -> None:
        w.add_tensor(f"blk.{il}.ffn_gate.weight", rnd(s.n_ff, s.n_embd))
        w.add_tensor(f"blk.{il}.ffn_up.weight", rnd(s.n_ff, s.n_embd))
        w.add_tensor(f"blk.{il}.ffn_down.weight", rnd(s.n_embd, s.n_ff))

    def attention(il: int) -> None:
        w.add_tensor(f"blk.{il}.attn_norm.weight", ones(s.n_embd))
        w.add_tensor(f"blk.{il}.post_attention_norm.weight", ones(s.n_embd))
        w.add_tensor(f"blk.{il}.attn_q.weight", rnd(head_dim * s.n_head * 2, s.n_embd))
        w.add_tensor(f"blk.{il}.attn_k.weight", rnd(head_dim * s.n_head, s.n_embd))
        w.add_tensor(f"blk.{il}.attn_v.weight", rnd(head_dim * s.n_head, s.n_embd))
        w.add_tensor(f"blk.{il}.attn_output.weight", rnd(s.n_embd, head_dim * s.n_head))
        w.add_tensor(f"blk.{il}.attn_q_norm.weight", ones(head_dim))
        w.add_tensor(f"blk.{il}.attn_k_norm.weight", ones(head_dim))
        ffn(il)

    def deltanet(il: int) -> None:
        w.add_tensor(f"blk.{il}.attn_norm.weight", ones(s.n_embd))
        w.add_tensor(f"blk.{il}.post_attention_norm.weight", ones(s.n_embd))
        w.add_tensor(f"blk.{il}.attn_qkv.weight", rnd(conv_dim, s.n_embd))
        w.add_tensor(f"blk.{il}.attn_gate.weight", rnd(value_dim, s.n_embd))
        w.add_tensor(f"blk.{il}.ssm_conv1d.weight", rnd(conv_dim, d_conv, scale=0.3))
        w.add_tensor(f"blk.{il}.ssm_dt.bias", rnd(s.dt_rank))
        w.add_tensor(f"blk.{il}.ssm_a", -np.exp(rnd(s.dt_rank, scale=0.5)))
        w.add_tensor(f"blk.{il}.ssm_beta.weight", rnd(s.dt_rank, s.n_embd))
        w.add_tensor(f"blk.{il}.ssm_alpha.weight", rnd(s.dt_rank, s.n_embd))
        w.add_tensor(f"blk.{il}.ssm_norm.weight", ones(s.d_state))
        w.add_tensor(f"blk.{il}.ssm_out.weight", rnd(s.n_embd, value_dim))
        ffn(il)

    for il in range(s.n_trunk):
        (attention if (il + 1) % s.interval == 0 else deltanet)(il)
    for il in range(s.n_trunk, s.n_trunk + n_nextn):
        attention(il)
        w.add_tensor(f"blk.{il}.nextn.eh_proj.weight", rnd(s.n_embd, 2 * s.n_embd))
        w.add_tensor(f"blk.{il}.nextn.enorm.weight", ones(s.n_embd))
        w.add_tensor(f"blk.{il}.nextn.hnorm.weight", ones(s.n_embd))
        w.add_tensor(f"blk.{il}.nextn.shared_head_norm.weight", ones(s.n_embd))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_header(
    path: Path,
    arch: str,
    tokens: list[str],
    tokenizer: str = "gpt2",
    add_bos: bool | None = None,
    metadata: dict[str, int] | None = None,
) -> Path:
    """A GGUF of metadata alone (no tensors): what the header-level checks read. ``tokens`` is
    the vocabulary; ``metadata`` more integer keys (``qwen35moe.expert_count``, ...)."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tokenizer_model(tokenizer)
    writer.add_token_list(tokens)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    for key, value in (metadata or {}).items():
        writer.add_uint32(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


@dataclass(frozen=True)
class LlamaShape:
    """The shape of a synthetic llama (an attention target for the EAGLE3 and DFlash heads)."""

    n_vocab: int = 128
    n_embd: int = 256
    n_head: int = 2
    n_ff: int = 384
    n_layer: int = 4
    n_ctx_train: int = 512

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


LLAMA = LlamaShape()
# The token a DFlash head's vocabulary names its mask (its block's not-yet-drafted positions).
MASK_TOKEN = LLAMA.n_vocab - 1


def _common(w: object, arch: str, s: LlamaShape, n_layer: int, mask: bool = False) -> None:
    """The hyperparameters and the ``test`` vocabulary every file here shares."""
    import gguf

    assert isinstance(w, gguf.GGUFWriter)
    w.add_context_length(s.n_ctx_train)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(s.head_dim)
    w.add_vocab_size(s.n_vocab)
    w.add_tokenizer_model("test")
    w.add_token_list([f"tok_{i}" for i in range(s.n_vocab)])
    w.add_token_scores([0.0] * s.n_vocab)
    if mask:
        w.add_mask_token_id(MASK_TOKEN)
    w.add_file_type(0)  # all F32


def _finish(w: object) -> None:
    import gguf

    assert isinstance(w, gguf.GGUFWriter)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _randoms(seed: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)

    def rnd(*dims: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(dims) * scale).astype(np.float32)

    return rng, rnd


def _ones(n: int) -> np.ndarray:
    return np.ones((n,), dtype=np.float32)


def _ffn(w: Any, rnd: Any, il: int, s: LlamaShape) -> None:
    w.add_tensor(f"blk.{il}.ffn_norm.weight", _ones(s.n_embd))
    w.add_tensor(f"blk.{il}.ffn_gate.weight", rnd(s.n_ff, s.n_embd))
    w.add_tensor(f"blk.{il}.ffn_up.weight", rnd(s.n_ff, s.n_embd))
    w.add_tensor(f"blk.{il}.ffn_down.weight", rnd(s.n_embd, s.n_ff))


# A shared direction (the first coordinate) in every token's embedding, and in the output rows
# of the first FOCUS tokens: with ``focus``, a target and a head that share its output layer
# both favour those tokens, so the head's q overlaps the target's p (random weights alone give
# distributions nearly disjoint, where a test of the residual has no power).
FOCUS = 12


def write_llama(
    path: Path,
    shape: LlamaShape = LLAMA,
    *,
    seed: int = 0,
    output_scale: float = 0.5,
    focus: float = 0.0,
    arch: str = "llama",
) -> Path:
    """Write a random llama GGUF at ``path``: the tiny attention target the heads draft for.
    ``focus``: how strongly the first ``FOCUS`` tokens are favoured (0: not). ``arch="qwen2"``:
    the same with the attention biases qwen2 has (a target whose graph hands out no layer
    states)."""
    import gguf

    s = shape
    _, rnd = _randoms(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}-s{seed}")
    _common(w, arch, s, s.n_layer)
    embeddings = rnd(s.n_vocab, s.n_embd, scale=0.5)
    output = rnd(s.n_vocab, s.n_embd, scale=output_scale)
    if focus:
        embeddings[:, 0] += 2.0
        output[:FOCUS, 0] += focus
    w.add_tensor("token_embd.weight", embeddings)
    w.add_tensor("output_norm.weight", _ones(s.n_embd))
    w.add_tensor("output.weight", output)
    for il in range(s.n_layer):
        w.add_tensor(f"blk.{il}.attn_norm.weight", _ones(s.n_embd))
        w.add_tensor(f"blk.{il}.attn_q.weight", rnd(s.n_embd, s.n_embd))
        w.add_tensor(f"blk.{il}.attn_k.weight", rnd(s.n_embd, s.n_embd))
        w.add_tensor(f"blk.{il}.attn_v.weight", rnd(s.n_embd, s.n_embd))
        w.add_tensor(f"blk.{il}.attn_output.weight", rnd(s.n_embd, s.n_embd))
        if arch == "qwen2":
            for name in ("q", "k", "v"):
                w.add_tensor(f"blk.{il}.attn_{name}.bias", np.zeros(s.n_embd, dtype=np.float32))
        _ffn(w, rnd, il, s)
    _finish(w)
    return path


def write_eagle3(
    path: Path,
    target: LlamaShape = LLAMA,
    *,
    layers: tuple[int, ...] = (0, 1, 3),
    seed: int = 2,
    draft_vocab: int = 0,
    output_scale: float = 0.5,
    focus: float = 0.0,
) -> Path:
    """Write a random EAGLE3 head for a ``target`` of that shape (llama.cpp's ``eagle3``
    architecture: one decoder layer over the token's embedding and the fused hidden states of
    the target's ``layers``). ``draft_vocab``: a reduced vocabulary of that many tokens with
    its own output layer, mapped to the target's ids by ``d2t``; 0: the target's own output
    layer and vocabulary (read through the target's context). ``focus``: its fusion starts from
    the last layer read (the target's state there), and its own output layer favours the
    ``FOCUS`` tokens as much (see ``write_llama``)."""
    import gguf

    s = target
    rng, rnd = _randoms(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "eagle3")
    w.add_name(f"tiny-eagle3-s{seed}")
    _common(w, "eagle3", s, 1)
    w.add_array("eagle3.target_layers", list(layers))
    w.add_uint32("eagle3.target_hidden_size", s.n_embd)
    fc = rnd(s.n_embd, len(layers) * s.n_embd, scale=0.1 if not focus else 0.02)
    if focus:
        fc[:, -s.n_embd :] += np.eye(s.n_embd, dtype=np.float32)
    w.add_tensor("fc.weight", fc)
    w.add_tensor("output_norm.weight", _ones(s.n_embd))
    if draft_vocab:
        rest = rng.choice(np.arange(FOCUS, s.n_vocab), size=draft_vocab - FOCUS, replace=False)
        ids = np.sort(np.concatenate([np.arange(FOCUS), rest])).astype(np.int64)
        output = rnd(draft_vocab, s.n_embd, scale=output_scale)
        if focus:
            output[:FOCUS, 0] += focus  # ids are sorted: the FOCUS tokens come first
        w.add_tensor("d2t", ids)
        w.add_tensor("output.weight", output)
    w.add_tensor("blk.0.attn_norm.weight", _ones(s.n_embd))
    w.add_tensor("blk.0.attn_norm_2.weight", _ones(s.n_embd))
    w.add_tensor("blk.0.attn_q.weight", rnd(s.n_embd, 2 * s.n_embd))
    w.add_tensor("blk.0.attn_k.weight", rnd(s.n_embd, 2 * s.n_embd))
    w.add_tensor("blk.0.attn_v.weight", rnd(s.n_embd, 2 * s.n_embd))
    w.add_tensor("blk.0.attn_output.weight", rnd(s.n_embd, s.n_embd))
    _ffn(w, rnd, 0, s)
    _finish(w)
    return path


def write_dflash(
    path: Path,
    target: LlamaShape = LLAMA,
    *,
    layers: tuple[int, ...] = (1, 3),
    block_size: int = 8,
    n_layer: int = 1,
    seed: int = 3,
    mask: bool = True,
) -> Path:
    """Write a random DFlash block drafter for a ``target`` of that shape (llama.cpp's
    ``dflash``: the fused hidden states of the target's ``layers`` written into its own cache,
    then one pass over ``[last, mask x n]`` gives a distribution for each of the n positions).
    It shares the target's embeddings and output layer; ``mask=False`` names no mask token (a
    broken head)."""
    import gguf

    s = target
    _, rnd = _randoms(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "dflash")
    w.add_name(f"tiny-dflash-s{seed}")
    _common(w, "dflash", s, n_layer, mask=mask)
    w.add_array("dflash.target_layers", list(layers))
    w.add_uint32("dflash.block_size", block_size)
    w.add_tensor("fc.weight", rnd(s.n_embd, len(layers) * s.n_embd, scale=0.1))
    w.add_tensor("enc.output_norm.weight", _ones(s.n_embd))
    w.add_tensor("output_norm.weight", _ones(s.n_embd))
    for il in range(n_layer):
        w.add_tensor(f"blk.{il}.attn_norm.weight", _ones(s.n_embd))
        w.add_tensor(f"blk.{il}.attn_q.weight", rnd(s.n_embd, s.n_embd))
        w.add_tensor(f"blk.{il}.attn_k.weight", rnd(s.n_embd, s.n_embd))
        w.add_tensor(f"blk.{il}.attn_v.weight", rnd(s.n_embd, s.n_embd))
        w.add_tensor(f"blk.{il}.attn_output.weight", rnd(s.n_embd, s.n_embd))
        w.add_tensor(f"blk.{il}.attn_q_norm.weight", _ones(s.head_dim))
        w.add_tensor(f"blk.{il}.attn_k_norm.weight", _ones(s.head_dim))
        _ffn(w, rnd, il, s)
    _finish(w)
    return path
