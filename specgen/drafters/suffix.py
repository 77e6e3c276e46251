"""The suffix cache: what this process has read and written, for guesses across requests.

Every finished generation (its prompt and its output) is kept as a document. Each cycle, the
text's last tokens are looked up among them: the documents where they occurred, how long the
match runs back, and what followed. The continuation the matching documents agree on (token by
token, the one most of them took: SuffixDecoding's frequency score) is a ``cache`` candidate,
with how long the match is and how many documents back it, so ``-k auto`` learns acceptance per
kind of evidence. Its guesses are point masses, verified by the target as every n-gram guess is:
exact.

Bounded: past ``max_tokens`` the document least recently useful (matched, or added) goes first.
A chat that goes on adds its whole history again: a document that begins with an earlier one
replaces it. Kept in a file on request (``save`` / ``load``): the documents only, tagged with
their format (``VERSION``, in the first line) and the vocabulary they are tokens of, and the
index built again on load.

Pure: tokens in, candidates out; no model and no llama.cpp.
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from specgen.drafters.base import Candidate

KEY = 4  # tokens of the index's key: shorter matches are the current text's own n-grams' job
SPAN = 32  # the longest continuation read out of a document
LONGEST = 64  # how far back a match is measured
PER_KEY = 16  # occurrences kept per key (the latest)
LONE_MATCH = 8  # the shortest match one document alone backs
DEFAULT_TOKENS = 200_000
# The file's format: its first line names it. A file of another number (another specgen's) is
# left alone, never read and never overwritten, as a corrupt one is.
VERSION = 1
_FORMAT = b"SPECGEN-SUFFIX-"
MAGIC = _FORMAT + b"%d\n" % VERSION
_MULT = np.uint64(0x9E3779B97F4A7C15)


def _keys(tokens: np.ndarray) -> list[int]:
    """One 64-bit hash per window of ``KEY`` tokens (collisions are checked on lookup)."""
    n = len(tokens) - KEY + 1
    if n <= 0:
        return []
    h = np.zeros(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(KEY):
            h = h * _MULT + tokens[j : j + n].astype(np.uint64) + np.uint64(1)
    return h.tolist()


_MULT_INT, _MASK = int(_MULT), (1 << 64) - 1


def _key(tokens: Sequence[int]) -> int:
    """``_keys``' hash of one window, in Python numbers: a lookup a cycle, where numpy's
    calls between decodes cost tens of microseconds."""
    h = 0
    for token in tokens[:KEY]:
        h = (h * _MULT_INT + token + 1) & _MASK
    return h


class SuffixCache:
    """Documents (earlier prompts and outputs, as tokens) and an index of their ``KEY``-grams."""

    def __init__(self, max_tokens: int = DEFAULT_TOKENS, vocabulary: str = "") -> None:
        self.max_tokens, self.vocabulary = max_tokens, vocabulary
        self._docs: OrderedDict[int, np.ndarray] = OrderedDict()  # least recently useful first
        self._index: dict[int, list[tuple[int, int]]] = {}  # key -> (doc, end of the key)
        self._next = 0
        self.tokens = 0
        self.changed = False

    def __len__(self) -> int:
        return len(self._docs)

    def clear(self) -> None:
        self._docs.clear()
        self._index.clear()
        self.tokens, self.changed = 0, True

    # -- what goes in ---------------------------------------------------------------------------
    def add(self, tokens: Sequence[int]) -> None:
        """A finished generation's tokens (its prompt, then its output)."""
        doc = np.asarray(tokens, dtype=np.int32)
        if len(doc) < KEY + 1 or len(doc) > self.max_tokens:
            return
        for ident in list(self._docs)[-8:]:  # a chat that goes on: drop the turn it extends
            old = self._docs[ident]
            if len(old) <= len(doc) and np.array_equal(old, doc[: len(old)]):
                self._drop(ident)
        ident, self._next = self._next, self._next + 1
        self._docs[ident] = doc
        self.tokens += len(doc)
        for end, key in enumerate(_keys(doc), start=KEY - 1):
            found = self._index.setdefault(key, [])
            found.append((ident, end))
            if len(found) > PER_KEY:
                del found[0]
        while self.tokens > self.max_tokens and self._docs:
            self._drop(next(iter(self._docs)))
        self.changed = True

    def _drop(self, ident: int) -> None:
        doc = self._docs.pop(ident)
        self.tokens -= len(doc)
        for key in set(_keys(doc)):
            found = self._index.get(key)
            if found is None:
                continue
            kept = [o for o in found if o[0] != ident]
            if kept:
                self._index[key] = kept
            else:
                del self._index[key]

    # -- what comes out -------------------------------------------------------------------------
    def candidate(self, context: Sequence[int], guesses: Sequence[int] = ()) -> Candidate | None:
        """The continuation the documents that end as the text does agree on (None: no match
        of ``KEY`` tokens). Its acceptance key says how long the match is (``cache4``,
        ``cache8``, ... ``cache64``: all of the ``LONGEST`` tokens looked up) and whether
        several documents back it (``+``)."""
        tail = [*context[-LONGEST:], *guesses]
        if len(tail) < KEY or not self._index:
            return None
        found = self._index.get(_key(tail[-KEY:]))
        if not found:
            return None
        # 1. Each occurrence: how far back it matches the text, and what followed it.
        want = np.asarray(tail[::-1], dtype=np.int32)
        matches: list[tuple[int, int, np.ndarray]] = []
        for ident, end in found:
            doc = self._docs[ident]
            back = doc[max(0, end + 1 - len(want)) : end + 1][::-1]
            same = back == want[: len(back)]
            length = int(np.argmin(same)) if not same.all() else len(back)
            follows = doc[end + 1 : end + 1 + SPAN]
            if length >= KEY and len(follows):
                matches.append((length, ident, follows))
        if not matches:
            return None
        # 2. The longest matches, and among them the path most of them took, token by token.
        best = max(m[0] for m in matches)
        backing = [m for m in matches if m[0] == best]
        if best < LONE_MATCH and len(backing) < 2:
            return None  # one document, a short match: too little evidence to pay a verify
        path: list[int] = []
        alive = [m[2] for m in backing]
        while alive and len(path) < SPAN:
            nexts = [int(f[len(path)]) for f in alive if len(f) > len(path)]
            if not nexts:
                break
            token = max(set(nexts), key=nexts.count)
            if nexts.count(token) * 2 < len(backing):  # fewer than half of them go on so
                break
            path.append(token)
            alive = [f for f in alive if len(f) >= len(path) and int(f[len(path) - 1]) == token]
        if not path:
            return None
        for _, ident, _ in backing:  # useful: kept longest
            self._docs.move_to_end(ident)
        # 64: the whole window looked up matches (a request sent again, a prompt seen before):
        # greedy, what followed is what follows, and ``-k auto`` learns so apart from cache32.
        bucket = next(b for b in (LONGEST, 32, 16, 8, 4) if best >= b)
        key = f"cache{bucket}{'+' if len(backing) > 1 else ''}"
        # A match of n tokens backs at most n guesses (SuffixDecoding's rule): a short match
        # that goes wrong fails one short cycle, not a 32-row verify.
        path = path[:best]
        return Candidate("cache", key, len(path), tuple(path), match_length=min(best, LONGEST))

    # -- kept in a file ---------------------------------------------------------------------
    def save(self, file: Path) -> None:
        """The documents and the vocabulary they are of, written atomically."""
        lengths = np.asarray([len(d) for d in self._docs.values()], dtype=np.int64)
        body = np.concatenate(list(self._docs.values())) if self._docs else np.zeros(0, np.int32)
        tag = self.vocabulary.encode()
        file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(MAGIC + struct.pack("<IQ", len(tag), len(lengths)) + tag)
                out.write(lengths.astype("<i8").tobytes() + body.astype("<i4").tobytes())
            os.replace(tmp, file)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.changed = False

    def load(self, file: Path) -> str | None:
        """Read the documents ``save`` wrote, oldest first; what was wrong, if anything (a
        corrupt file, another format's or another vocabulary's), in which case nothing is
        read."""
        try:
            data = file.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            return f"cannot read {file}: {err.strerror or err}"
        other = _format_of(data)
        if other is not None and other != str(VERSION):
            return (
                f"{file} is a lookup cache of another specgen version (format {other}; this "
                f"one reads {VERSION}): left alone"
            )
        try:
            if not data.startswith(MAGIC):
                raise ValueError("not a specgen lookup cache")
            at = len(MAGIC)
            n_tag, n_docs = struct.unpack_from("<IQ", data, at)
            at += 12
            tag = data[at : at + n_tag].decode()
            at += n_tag
            lengths = np.frombuffer(data, "<i8", n_docs, at)
            at += 8 * n_docs
            body = np.frombuffer(data, "<i4", int(lengths.sum()), at)
            if at + 4 * len(body) != len(data) or (lengths < 0).any():
                raise ValueError("cut short")
        except (ValueError, struct.error, UnicodeDecodeError) as err:
            return f"{file} is not a lookup cache specgen can read ({err}): left alone"
        if self.vocabulary and tag != self.vocabulary:
            return f"{file} holds another model vocabulary's tokens: left alone"
        start = 0
        for n in lengths.tolist():
            self.add(body[start : start + n].tolist())
            start += n
        self.changed = False
        return None


def _format_of(data: bytes) -> str | None:
    """The format a lookup cache file's first line names (None: not a first line of ours)."""
    head = data[: len(_FORMAT) + 17]
    number, line_ends, _ = head.removeprefix(_FORMAT).partition(b"\n")
    if not head.startswith(_FORMAT) or not line_ends:
        return None
    return number.decode("ascii", "replace")
