"""What a model is, from its GGUF header alone: attention, hybrid or recurrent; MTP heads; MoE.

``specgen models info`` / ``models check`` / ``doctor`` show it before anything loads, and
``specgen.session.pair`` checks it before llama.cpp sees the file, since some files make llama.cpp
abort the process instead of failing (``load_problem``). Pure: it reads a ``gguf.Header``.

The rules are llama.cpp's (0.3.36): a qwen35 layer i is full attention when ``(i + 1) %
full_attention_interval == 0`` (default 4), unless ``attention.recurrent_layers`` lists them;
hybrids of the Mamba kind mark their recurrent layers with no KV heads; a GGUF carries MTP
layers when the tensor ``blk.{block_count - 1}.nextn.eh_proj.weight`` exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from specgen.models.gguf import Header

# Gated-DeltaNet + attention (Qwen3.5 / 3.6 / 3.8, Qwen3-Next).
DELTANET_ARCHS = ("qwen35", "qwen35moe", "qwen3next")
# Every layer recurrent.
RECURRENT_ARCHS = ("mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7")
# Mamba or short-convolution layers beside attention, marked by no KV heads.
MAMBA_HYBRID_ARCHS = (
    "nemotron_h", "nemotron_h_moe", "jamba", "granitehybrid", "falcon-h1", "lfm2", "lfm2moe",
    "plamo2",
)  # fmt: skip
# Whose recurrent state llama.cpp can roll back by per-token snapshots (llama-arch.cpp,
# llm_arch_supports_rs_rollback); the others roll back by checkpoint only.
SNAPSHOT_ARCHS = ("qwen35", "qwen35moe", "nemotron_h", "nemotron_h_moe", "lfm2", "lfm2moe")
# A mixture of experts that runs at most this share of its experts per token: a draft model
# cannot pay for itself there, since the target's step is already cheap.
FEW_ACTIVE_EXPERTS = 1 / 8
STATE_ITEM_BYTES = 4  # llama.cpp keeps recurrent states in F32

Kind = Literal["attention", "hybrid", "recurrent"]


@dataclass(frozen=True)
class Layout:
    architecture: str
    n_layers: int  # the trunk (MTP blocks apart)
    recurrent_layers: int | None  # None: a hybrid whose header does not say which layers
    mtp_layers: int  # MTP (nextn) blocks with their weights
    mtp_declared: int  # what nextn_predict_layers says
    experts: int = 0
    experts_used: int = 0
    state_bytes: int | None = None  # the recurrent state of one sequence, where known

    @property
    def kind(self) -> Kind:
        if self.architecture in RECURRENT_ARCHS:
            return "recurrent"
        if self.architecture in DELTANET_ARCHS + MAMBA_HYBRID_ARCHS:
            return "hybrid"
        return "attention"

    @property
    def attention_layers(self) -> int | None:
        if self.recurrent_layers is None:
            return None
        return self.n_layers - self.recurrent_layers

    @property
    def snapshots(self) -> bool:
        """Whether llama.cpp rolls this recurrent state back by snapshots (else checkpoints)."""
        return self.architecture in SNAPSHOT_ARCHS

    @property
    def few_active_experts(self) -> bool:
        """A mixture of experts with few active parameters (Qwen3.6-35B-A3B, gpt-oss)."""
        return self.experts > 0 and self.experts_used / self.experts <= FEW_ACTIVE_EXPERTS

    def rollback(self, window: int) -> str:
        """How a rollback is done, in words, with ``window`` snapshots asked for."""
        if self.kind == "attention":
            return "cut the KV cache (any length)"
        if self.snapshots and window > 0:
            return f"llama.cpp snapshots up to K={window}, a state checkpoint beyond"
        if self.snapshots:
            return "a state checkpoint every cycle"
        return "a state checkpoint every cycle (llama.cpp keeps no snapshots for this architecture)"

    def snapshot_bytes(self, window: int) -> int | None:
        """The recurrent state memory with ``window`` snapshots: x(1 + window)."""
        if self.state_bytes is None:
            return None
        return self.state_bytes * (1 + (window if self.snapshots else 0))

    def as_dict(self, window: int) -> dict[str, object]:
        """What ``models info`` shows of the layout, with ``window`` snapshots (``-k auto``)."""
        return {
            "kind": self.kind,
            "layers": self.n_layers,
            "recurrent_layers": self.recurrent_layers,
            "attention_layers": self.attention_layers,
            "mtp_heads": self.mtp_layers,
            "experts": f"{self.experts_used} of {self.experts}" if self.experts else None,
            "rollback": self.rollback(window),
            "state_bytes": self.state_bytes if self.kind != "attention" else None,
            "snapshot_bytes": self.snapshot_bytes(window) if self.kind != "attention" else None,
        }

    def describe(self) -> str:
        """One line: ``hybrid: 6 recurrent + 2 attention layers, 1 MTP head``."""
        if self.kind == "attention":
            text = f"attention: {self.n_layers} layers"
        elif self.recurrent_layers is None:
            text = f"{self.kind}: {self.n_layers} layers"
        else:
            text = (
                f"{self.kind}: {self.recurrent_layers} recurrent + "
                f"{self.attention_layers} attention layers"
            )
        if self.mtp_layers:
            text += f", {self.mtp_layers} MTP head{'s' if self.mtp_layers > 1 else ''}"
        if self.experts:
            text += f", MoE {self.experts_used} of {self.experts} experts"
        return text


def layout(header: Header) -> Layout:
    """The layout a header describes."""
    arch = str(header.get("general.architecture") or "unknown")

    def key(name: str, default: Any = None) -> Any:
        return header.get(f"{arch}.{name}", default)

    blocks = _int(key("block_count"), 0)
    declared = _int(key("nextn_predict_layers"), 0)
    n_layers = max(blocks - declared, 0)
    if header.tensors is None:
        mtp = declared
    else:
        mtp = declared if f"blk.{blocks - 1}.nextn.eh_proj.weight" in header.tensors else 0
    recurrent = _recurrent_layers(arch, n_layers, key)
    return Layout(
        architecture=arch,
        n_layers=n_layers,
        recurrent_layers=recurrent,
        mtp_layers=mtp,
        mtp_declared=declared,
        experts=_int(key("expert_count"), 0),
        experts_used=_int(key("expert_used_count"), 0),
        state_bytes=_state_bytes(arch, recurrent, key),
    )


def load_problem(found: Layout, mtp: bool) -> str | None:
    """Why llama.cpp would abort the process on this file (not fail: abort), or None."""
    qwen35 = found.architecture in DELTANET_ARCHS[:2]
    if qwen35 and found.n_layers > 0 and found.recurrent_layers == 0:
        return (
            f"this {found.architecture} GGUF has no recurrent (DeltaNet) layer, which makes "
            f"llama.cpp abort on its first decode; the file is broken or mislabeled"
        )
    if qwen35 and found.n_layers > 0 and found.attention_layers == 0:
        return (
            f"this {found.architecture} GGUF has no attention layer, which makes llama.cpp "
            f"abort on its first decode; the file is broken or mislabeled"
        )
    if mtp and found.architecture in DELTANET_ARCHS and found.mtp_layers != 1:
        return (
            f"llama.cpp's {found.architecture} MTP graph takes exactly one MTP block and this "
            f"file has {found.mtp_layers}; pass --no-mtp"
        )
    return None


# Bytes of one cached key or value element (llama.cpp's default F16 cache).
KV_ITEM_BYTES = 2


def kv_bytes_per_token(header: Header) -> int:
    """Bytes the attention cache holds per token of context, for every attention layer (the
    keys and the values at F16); 0 where the header does not say."""
    arch = str(header.get("general.architecture") or "unknown")

    def key(name: str) -> Any:
        return header.get(f"{arch}.{name}")

    n_layers = layout(header).attention_layers or 0
    heads = _int(key("attention.head_count"), 0)
    width = _int(key("embedding_length"), 0)
    per_head = width // heads if heads else 0
    k_len = _int(key("attention.key_length"), per_head)
    v_len = _int(key("attention.value_length"), per_head)
    kv_heads = key("attention.head_count_kv")
    if isinstance(kv_heads, list):  # per layer (0 on a recurrent layer)
        total_heads = sum(int(h) for h in kv_heads if isinstance(h, int))
    else:
        total_heads = _int(kv_heads, heads) * n_layers
    return total_heads * (k_len + v_len) * KV_ITEM_BYTES


def _recurrent_layers(arch: str, n_layers: int, key: Any) -> int | None:
    if arch in RECURRENT_ARCHS:
        return n_layers
    if arch in DELTANET_ARCHS:
        marked = key("attention.recurrent_layers")
        if isinstance(marked, list):
            return sum(bool(v) for v in marked[:n_layers])
        interval = _int(key("full_attention_interval"), 4) or 1
        return sum((i + 1) % interval != 0 for i in range(n_layers))
    if arch in MAMBA_HYBRID_ARCHS:
        heads = key("attention.head_count_kv")
        if isinstance(heads, list):
            return sum(int(v) == 0 for v in heads[:n_layers])
        return None
    return 0


def _state_bytes(arch: str, recurrent: int | None, key: Any) -> int | None:
    """One sequence's recurrent state, from the SSM sizes (llama.cpp's r and s tensors)."""
    if not recurrent:
        return 0 if recurrent == 0 else None
    d_conv, d_inner = _int(key("ssm.conv_kernel"), 0), _int(key("ssm.inner_size"), 0)
    d_state, groups = _int(key("ssm.state_size"), 0), _int(key("ssm.group_count"), 0)
    if not (d_conv and d_inner and d_state):
        return None
    if arch in DELTANET_ARCHS:  # Gated DeltaNet: a d_state x d_state matrix per value head
        heads = _int(key("ssm.time_step_rank"), 0)
        conv = (d_conv - 1) * (2 * d_state * groups + d_state * heads)
        ssm = d_state * d_state * heads
    else:  # Mamba (groups 0) and Mamba-2
        conv = (d_conv - 1) * (d_inner + 2 * groups * d_state)
        ssm = d_state * d_inner
    return (conv + ssm) * STATE_ITEM_BYTES * recurrent


def _int(value: Any, default: int) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else default


# Heads that draft from the target's own hidden states (llama.cpp's architectures), and the
# target architectures whose graph hands out a layer's input states to them (the models that
# set ``t_layer_inp`` in llama.cpp 0.3.36's src/models; any other target aborts the process).
HEAD_ARCHS = ("eagle3", "dflash")
LAYER_STATE_ARCHS = (
    "bailingmoe3", "deepseek4", "gemma4", "gpt-oss", "hunyuan_vl", "lfm2", "llama", "mimo2",
    "minimax-01", "minimax-m2", "muse-glimmer", "nanbeige", "nemotron_h", "qwen3", "qwen35",
    "qwen35moe", "qwen3moe", "qwen3next", "qwen4exp",
)  # fmt: skip
HEAD_NAMES = {"eagle3": "an EAGLE3 head", "dflash": "a DFlash head"}
# Head architectures of llama.cpp forks, published as GGUFs on the Hub, that llama.cpp itself
# (and so llama-cpp-python) does not load.
FORK_HEAD_ARCHS = {"dflash-draft": "a DFlash head for the buun-llama-cpp fork"}


@dataclass(frozen=True)
class HeadLayout:
    """What an EAGLE3 or DFlash head is, from its header: the target layers it reads, how wide
    it expects their states, its own width, and (DFlash) its block."""

    kind: str
    layers: tuple[int, ...]
    target_width: int  # the target's hidden size it was trained on (0: not said)
    width: int
    block_size: int = 0
    variant: str = ""  # "DSpark" or "DFlash2": DFlash with more heads, not run yet
    header: Header | None = None  # what it was read from

    def describe(self) -> str:
        """One line for ``models info``."""
        what = HEAD_NAMES[self.kind]
        block = f", {self.block_size - 1} guesses a pass" if self.block_size else ""
        variant = f" ({self.variant})" if self.variant else ""
        return f"{what}{variant} reading target layers {list(self.layers)}{block}"


def head_layout(header: Header) -> HeadLayout | None:
    """The head a header describes (None: not a head)."""
    arch = str(header.get("general.architecture") or "")
    if arch not in HEAD_ARCHS:
        return None
    layers = header.get(f"{arch}.target_layers")
    ids = tuple(int(v) for v in layers) if isinstance(layers, list) else ()
    names = header.tensors or ()
    variant = ""
    if arch == "dflash":
        if "markov_w1.weight" in names:  # llama.cpp's own test for a DSpark head
            variant = "DSpark"
        elif any(name.startswith("selector_hidden") for name in names):
            variant = "DFlash2"
    return HeadLayout(
        kind=arch,
        layers=ids,
        target_width=_int(header.get(f"{arch}.target_hidden_size"), 0),
        width=_int(header.get(f"{arch}.embedding_length"), 0),
        block_size=_int(header.get("dflash.block_size"), 16) if arch == "dflash" else 0,
        variant=variant,
        header=header,
    )


def head_problem(head: HeadLayout, target: Header) -> str | None:
    """Why this head cannot draft for this target (one line), or None. Each of these would make
    llama.cpp abort the process, or read the wrong rows."""
    what = HEAD_NAMES[head.kind]
    if head.variant:
        return f"it is {what} of the {head.variant} kind, which specgen cannot run yet"
    if head.kind == "eagle3" and len(head.layers) != 3:
        return f"it reads {len(head.layers)} target layers, and {what} reads 3"
    if not head.layers:
        return "it names no target layers to read (no target_layers in its header)"
    found = layout(target)
    if found.architecture not in LAYER_STATE_ARCHS:
        return (
            f"its target is a {found.architecture} model, whose layers llama.cpp cannot hand "
            f"to a head (it can for {', '.join(LAYER_STATE_ARCHS[:6])}, ...)"
        )
    if found.n_layers in head.layers:
        return (
            f"it reads the target's final hidden state (layer {found.n_layers}), which specgen "
            f"cannot hand to a head yet"
        )
    outside = [lid for lid in head.layers if not 0 <= lid < found.n_layers]
    if outside:
        return (
            f"it reads target layers {list(head.layers)} and the target has {found.n_layers}: "
            f"it is a head for another target"
        )
    own = head.header.get("tokenizer.ggml.tokens") if head.header is not None else None
    tokens = [own, target.get("tokenizer.ggml.tokens")]
    if all(isinstance(t, list) for t in tokens) and len(tokens[0]) != len(tokens[1]):
        return (
            f"its vocabulary has {len(tokens[0])} tokens and the target's {len(tokens[1])}: "
            f"it is a head for another target"
        )
    width = _int(target.get(f"{found.architecture}.embedding_length"), 0)
    wanted = head.target_width if head.kind == "eagle3" else head.width
    if wanted and width and wanted != width:
        return (
            f"it reads hidden states {wanted} wide and the target's are {width}: it is a head "
            f"for another target"
        )
    return None
