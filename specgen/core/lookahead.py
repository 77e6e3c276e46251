"""The lookahead K a user may ask for: a fixed K from 0 to ``MAX_LOOKAHEAD``, or ``"auto"``.

One home for what K may be (the CLI, models.toml, the API and bench share it) and for the rule
that a generation with nothing to draft runs the target alone. Pure values: the policies that
choose K each cycle are ``specgen.lookahead``'s.
"""

from __future__ import annotations

from typing import Literal

# A lookahead as asked for: a fixed K, or "auto" (chosen before each cycle from past cycles).
Lookahead = int | Literal["auto"]
# The largest K anyone may ask for (the CLI, models.toml, the API and bench share it).
MAX_LOOKAHEAD = 64
# K when nothing else says (a named pair's own, and what bench found, come first): auto, which
# matched or beat the best fixed K on the demo pairs and never runs much slower than the target
# alone.
DEFAULT_LOOKAHEAD: Lookahead = "auto"
LOOKAHEAD_RANGE = f"'auto' or a K from 0 to {MAX_LOOKAHEAD}"


def check_lookahead(value: object, what: str = "lookahead (K)") -> Lookahead:
    """``value`` as a lookahead: "auto" or a whole number from 0 to MAX_LOOKAHEAD; ValueError
    (naming ``what``) otherwise."""
    if value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_LOOKAHEAD:
        return value
    raise ValueError(f"{what} must be {LOOKAHEAD_RANGE}")


def is_lookahead(value: object) -> bool:
    """Whether ``value`` is a lookahead one may ask for (``check_lookahead``)."""
    try:
        check_lookahead(value)
    except ValueError:
        return False
    return True


def parse_lookahead(text: str) -> Lookahead:
    """``"auto"`` or a whole number from 0 to MAX_LOOKAHEAD, as typed; ValueError otherwise."""
    if text.strip().lower() == "auto":
        return "auto"
    return check_lookahead(int(text))


def effective_lookahead(lookahead: Lookahead, drafts: bool) -> Lookahead:
    """The lookahead a generation runs at: what was asked for, or 0 (the target alone) where
    nothing drafts."""
    return lookahead if drafts else 0
