"""Can this draft serve this target? The vocabulary check, with llama.cpp's own rule.

Speculation only works when a draft token id means the same text to the target. The rule is the
one llama.cpp applies before it speculates (``common_speculative_are_compatible``): same
vocabulary type; same BOS/EOS ids where they are added; sizes within 128 of each other; identical
token text for every id from 5 up to the smaller size. This module is pure: it reads vocabularies
through the small ``VocabView`` shape (``specgen.backend.Vocabulary`` has it, read without the
weights), so tests can feed it fakes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

MAX_SIZE_DIFFERENCE = 128
FIRST_CHECKED_TOKEN = 5
VOCAB_TYPES = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLAMO2"}


class VocabView(Protocol):
    n_vocab: int

    @property
    def vocab_type(self) -> int: ...
    @property
    def bos(self) -> int: ...
    @property
    def eos(self) -> int: ...
    @property
    def adds_bos(self) -> bool: ...
    @property
    def adds_eos(self) -> bool: ...
    def token_text(self, token: int) -> bytes: ...


@dataclass(frozen=True)
class Fit:
    ok: bool
    reason: str = ""
    # What differs: "type", "bos", "eos", "size", "token" (then ``token`` is its id).
    what: str = ""
    token: int = -1

    def __bool__(self) -> bool:
        return self.ok


def check(target: VocabView, draft: VocabView) -> Fit:
    """Whether the draft fits the target, with the first reason it does not."""
    if target.vocab_type != draft.vocab_type:
        return Fit(
            False,
            f"vocabulary types differ (target {_type(target.vocab_type)}, "
            f"draft {_type(draft.vocab_type)})",
            "type",
        )
    for name in ("bos", "eos"):
        adds = f"adds_{name}"
        if getattr(target, adds) != getattr(draft, adds):
            return Fit(
                False, f"one model adds {name.upper()} to prompts and the other does not", name
            )
        if getattr(target, adds) and getattr(target, name) != getattr(draft, name):
            return Fit(
                False,
                f"{name.upper()} ids differ (target {getattr(target, name)}, "
                f"draft {getattr(draft, name)})",
                name,
            )
    difference = abs(target.n_vocab - draft.n_vocab)
    if difference > MAX_SIZE_DIFFERENCE:
        return Fit(
            False,
            f"vocabulary sizes differ by {difference} (target "
            f"{target.n_vocab}, draft {draft.n_vocab}; at most "
            f"{MAX_SIZE_DIFFERENCE} allowed)",
            "size",
        )
    for token in range(FIRST_CHECKED_TOKEN, min(target.n_vocab, draft.n_vocab)):
        t_text, d_text = target.token_text(token), draft.token_text(token)
        if t_text != d_text:
            return Fit(
                False,
                f"token {token} differs: target {_show(t_text)}, draft {_show(d_text)}",
                "token",
                token,
            )
    return Fit(True)


# Vocabulary sizes of the families whose mix-ups users meet most (from their GGUFs).
QWEN35_VOCAB = 248320  # Qwen3.5 / 3.6 / 3.8
QWEN_VOCABS = (151936, 152064)  # Qwen2.5 (152064 from 7B up) and Qwen3
QWEN3_FIRST_OWN_TOKEN = 151665  # Qwen3's <tool_response>; Qwen2.5 has other text there


def advice(fit: Fit, target_arch: str, draft_arch: str, target: VocabView, draft: VocabView) -> str:
    """The next step for a draft that does not fit, where the families say more than the rule:
    the drafts people try for Qwen3.5/3.6, Qwen3 and Gemma 4, and Gemma 4's early files."""
    if fit.ok:
        return ""
    sizes = {target.n_vocab, draft.n_vocab}
    if QWEN35_VOCAB in sizes and sizes & set(QWEN_VOCABS):
        return (
            f"Qwen3.5/3.6 have a {QWEN35_VOCAB}-token vocabulary and Qwen3/Qwen2.5 one of "
            f"151936: draft Qwen3.5/3.6 with Qwen3.5-0.8B (or the target's MTP head: --draft mtp)"
        )
    if fit.what == "token" and fit.token >= QWEN3_FIRST_OWN_TOKEN and sizes <= set(QWEN_VOCABS):
        return (
            f"Qwen2.5 and Qwen3 share ids below {QWEN3_FIRST_OWN_TOKEN} only: draft Qwen3 with "
            f"Qwen3-0.6B or 1.7B, Qwen2.5 with Qwen2.5-0.5B"
        )
    families = {target_arch, draft_arch}
    if "gemma4" in families and families & {"gemma3", "gemma2", "gemma"}:
        return (
            "Gemma 3 vocabularies are SentencePiece and Gemma 4's is BPE (262144 tokens, other "
            "ids): draft Gemma 4 with Gemma 4 E2B"
        )
    if fit.what == "bos" and families == {"gemma4"}:
        return (
            "Gemma 4 GGUFs uploaded in early April 2026 disagree on add_bos_token (false on the "
            "31B, true on E2B); download the files again, or use the revision models.toml pins"
        )
    return ""


def _type(code: int) -> str:
    return VOCAB_TYPES.get(code, str(code))


def _show(text: bytes) -> str:
    return repr(text.decode("utf-8", errors="replace"))
