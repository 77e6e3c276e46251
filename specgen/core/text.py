"""Turning accepted token pieces into printable text, and stopping on stop strings.

Pieces are bytes: one UTF-8 character can be split across tokens, so text is decoded
incrementally and a partial character is held back until it completes. A stop string can also
span tokens, so the tail of the text that could still become a stop string is held back too.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class StreamDecoder:
    """Bytes in, whole characters out; never prints half a character."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class StopMatcher:
    """Holds back text that might begin a stop string; reports when one appears.

    ``feed`` returns the text that is safe to print and whether a stop string was found (the
    stop string itself and anything after it are never returned).
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        buf = self._held + text
        if not self.stops:
            self._held = ""
            return buf, False
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self._held = ""
            return buf[: min(hits)], True
        keep = self._longest_open_prefix(buf)
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """At the end of generation, what was held back is ordinary text after all."""
        held, self._held = self._held, ""
        return held

    def _longest_open_prefix(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best
