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

    def __bool__(self) -> bool:
        return self.ok


def check(target: VocabView, draft: VocabView) -> Fit:
    """Whether the draft fits the target, with the first reason it does not."""
    if target.vocab_type != draft.vocab_type:
        return Fit(
            False,
            f"vocabulary types differ (target {_type(target.vocab_type)}, "
            f"draft {_type(draft.vocab_type)})",
        )
    for name in ("bos", "eos"):
        adds = f"adds_{name}"
        if getattr(target, adds) != getattr(draft, adds):
            return Fit(False, f"one model adds {name.upper()} to prompts and the other does not")
        if getattr(target, adds) and getattr(target, name) != getattr(draft, name):
            return Fit(
                False,
                f"{name.upper()} ids differ (target {getattr(target, name)}, "
                f"draft {getattr(draft, name)})",
            )
    difference = abs(target.n_vocab - draft.n_vocab)
    if difference > MAX_SIZE_DIFFERENCE:
        return Fit(
            False,
            f"vocabulary sizes differ by {difference} (target "
            f"{target.n_vocab}, draft {draft.n_vocab}; at most "
            f"{MAX_SIZE_DIFFERENCE} allowed)",
        )
    for token in range(FIRST_CHECKED_TOKEN, min(target.n_vocab, draft.n_vocab)):
        t_text, d_text = target.token_text(token), draft.token_text(token)
        if t_text != d_text:
            return Fit(
                False, f"token {token} differs: target {_show(t_text)}, draft {_show(d_text)}"
            )
    return Fit(True)


def _type(code: int) -> str:
    return VOCAB_TYPES.get(code, str(code))


def _show(text: bytes) -> str:
    return repr(text.decode("utf-8", errors="replace"))
