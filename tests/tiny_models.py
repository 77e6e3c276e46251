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
