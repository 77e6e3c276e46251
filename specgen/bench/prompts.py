"""The prompts ``specgen bench`` runs: a built-in set of kinds of work, or the user's file.

A prompt may come with what its answer must match (the built-in ``json`` extraction, or a
file's line with ``json_schema`` / ``grammar`` / ``response_format``): every row runs it under
that grammar, the target alone too, so its speedup is constrained against constrained.
"""

from __future__ import annotations

from pathlib import Path

from specgen.errors import UserError
from specgen.structured.grammar import Grammar, json_schema

# The built-in prompts, each with its kind: the kinds answer "which drafter for which task".
# "rewrite" and "extract" prompts carry a passage the answer copies from (prompt lookup's home
# ground); the others ask for new text. Phrased to work for base and chat models alike.
PASSAGE = (
    "The printing press, developed by Johannes Gutenberg around 1440, made books cheaper "
    "and faster to produce. Ideas spread across Europe within years instead of decades, "
    "literacy rose, and the Reformation and the scientific revolution both owed much to "
    "pamphlets and journals that could be printed in thousands of copies."
)
CODE = (
    "def order_value(orders):\n    total = 0\n    for order in orders:\n        if "
    "order.paid:\n            total += order.price * order.quantity\n    return total\n\n\n"
    'def report(orders):\n    total = order_value(orders)\n    print(f"Paid orders: '
    '{total:.2f}")\n    return total\n'
)
BUILTIN = [
    ("explain", "Explain in a few sentences why the sky is blue."),
    ("explain", "What are the main differences between a list and a tuple in Python?"),
    ("code", "Write a Python function that returns the n-th Fibonacci number, with a docstring."),
    ("code", "Write a SQL query that finds the ten customers with the highest total order value."),
    ("summarize", f"Summarize this passage in two sentences: {PASSAGE}"),
    (
        "rewrite",
        "Rewrite this sentence in a formal tone: hey, the meeting got moved to friday, "
        "can u make it?",
    ),
    (
        "rewrite",
        "Correct the spelling mistakes in this paragraph and write it out in full.\n\n"
        "Paragraph: The printing pres, developped by Johannes Gutenberg around 1440, "
        "made books cheeper and faster to produce. Ideas spread accross Europe within "
        "years insted of decades, literacy rose, and the Reformation and the scientific "
        "revolution both owed much to pamflets and journals that could be printed in "
        "thousands of copys.\n\nCorrected paragraph:",
    ),
    (
        "rewrite",
        "Rename the variable `total` to `order_sum` in this code and show the whole "
        f"code.\n\n```python\n{CODE}```\n\nThe code with `order_sum`:\n\n```python\n",
    ),
    (
        "repeat",
        "Add a docstring to each function of this code and show the whole code.\n\n"
        f"```python\n{CODE}```\n\nThe code with docstrings:\n\n```python\n",
    ),
    (
        "extract",
        f"Copy out, word for word, every sentence of this passage that mentions "
        f"Europe or Gutenberg.\n\nPassage: {PASSAGE}\n\nSentences:",
    ),
    # Related to the requests before them, as a server's or a batch's next request is: the
    # same passage again (the suffix cache's ground; each other row reads it afresh).
    (
        "repeat",
        f"Copy out, word for word, every sentence of this passage that mentions the "
        f"Reformation or literacy.\n\nPassage: {PASSAGE}\n\nSentences:",
    ),
    ("list", "List ten countries in Europe and their capital cities."),
    ("howto", "Give a step-by-step recipe for a simple tomato soup."),
    (
        "story",
        "Write the opening paragraph of a story about a lighthouse keeper who finds a "
        "message in a bottle.",
    ),
    ("translate", "Translate to French: The train leaves at eight o'clock tomorrow morning."),
    (
        "json",
        "Fill in this JSON object from the passage: the inventor, the year, the invention and "
        f"the places it changed.\n\nPassage: {PASSAGE}\n\nJSON:",
    ),
]
BUILTIN_PROMPTS = [prompt for _, prompt in BUILTIN]
BUILTIN_KINDS = [kind for kind, _ in BUILTIN]
# The schema the built-in "json" prompt's answer fills (an extraction, as agents ask for).
EXTRACTION_SCHEMA = {
    "type": "object",
    "properties": {
        "inventor": {"type": "string", "maxLength": 60},
        "year": {"type": "integer"},
        "invention": {"type": "string", "maxLength": 60},
        "places": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 6},
    },
    "required": ["inventor", "year", "invention", "places"],
    "additionalProperties": False,
}


def builtin_grammars() -> list[Grammar | None]:
    """What each built-in prompt's answer must match (None: free text)."""
    return [json_schema(EXTRACTION_SCHEMA) if kind == "json" else None for kind in BUILTIN_KINDS]


def load_prompts(path: Path) -> tuple[list[str], list[Grammar | None]]:
    """One prompt per line (``\\n`` for a newline inside one), or JSON lines with a "prompt"
    field and optionally what the answer must match, as ``specgen run`` reads them; blank lines
    are skipped. The prompts, and each one's grammar (None: free text)."""
    from specgen.session.prompts import BadLine, parse_record, unescape

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read prompts from {path}: {err}") from err
    prompts: list[str] = []
    grammars: list[Grammar | None] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if not line.lstrip().startswith("{"):
            prompts.append(unescape(line))
            grammars.append(None)
            continue
        item = parse_record(line, number)
        if isinstance(item, BadLine):
            raise UserError(f"{path}, {item.error}")
        if item.prompt is None:
            raise UserError(f'{path}, line {number}: bench takes "prompt" lines, not "messages"')
        prompts.append(item.prompt)
        grammars.append(item.settings.get("grammar"))
    if not prompts:
        raise UserError(f"{path} holds no prompts")
    return prompts, grammars
