"""llguidance's tokenizer for a loaded model, built from llama.cpp's own vocabulary.

llguidance walks the vocabulary (each token's bytes, control tokens marked) and keeps
llama.cpp's tokenize function for its canonical tokenizations (forced tokens). That takes about
0.6 s for a 49k vocabulary and 2.2 s for Gemma's 262k on a 2-core machine, so it is built once per
loaded model and kept. Every token that ends a generation (EOS, EOT, ...) counts as an end for
the grammar: it may come exactly where the grammar is complete.
"""

from __future__ import annotations

import warnings
from typing import Any

import llama_cpp

from specgen.errors import UserError


def tokenizer_for(vocab: llama_cpp.llama_vocab_p, ends: list[int], name: str) -> Any:
    """llguidance's ``LLTokenizer`` for a llama.cpp vocabulary whose end-of-generation tokens
    are ``ends`` (``name``: the model file, for the messages). The caller keeps it."""
    try:
        from llguidance.llamacpp import lltokenizer_from_vocab
    except ImportError as err:  # pragma: no cover - a dependency of specgen
        raise UserError(
            "structured output needs llguidance: pip install 'llguidance>=1.9.1'"
        ) from err
    if not ends:
        raise UserError(
            f"{name} has no end-of-generation token, which a grammar needs to end "
            f"on: structured output cannot run on it"
        )
    with warnings.catch_warnings():
        # llguidance asks each token's attributes by a name llama-cpp-python deprecated.
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            tokenizer = lltokenizer_from_vocab(vocab, eos_token=ends)
        except ValueError as err:  # a vocabulary llguidance cannot tokenize with
            raise UserError(
                f"llguidance cannot build a tokenizer for {name}'s vocabulary "
                f"({err}): structured output cannot run on it"
            ) from err
    return tokenizer
