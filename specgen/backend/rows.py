"""A decode's rows as their top-k, taken in llama.cpp's graph by its backend sampling.

On a GPU the whole row never leaves the device: each output row's k likeliest tokens and their
logits come back as ``core.sampling.TopK`` rows.
"""

from __future__ import annotations

import llama_cpp
import numpy as np

from specgen.core.sampling import TopK
from specgen.errors import BackendError

# llama.cpp's backend sampling ([EXPERIMENTAL] there): llama-cpp-python 0.3.36 binds it.
BACKEND_SAMPLING = hasattr(llama_cpp, "llama_set_sampler") and hasattr(
    llama_cpp, "llama_get_sampled_candidates_ith"
)


class TopKRows:
    """llama.cpp's backend sampling on one sequence of a context: each output row's top-k,
    taken in the graph, read back as ``TopK`` rows."""

    def __init__(
        self,
        ctx: llama_cpp.llama_context_p,
        n_vocab: int,
        enabled: bool,
        name: str,
        seq: int = 0,
    ):
        self._ctx, self.n_vocab, self.enabled, self.name = ctx, n_vocab, enabled, name
        self.seq = seq
        self.k = 0
        self._chain: llama_cpp.llama_sampler_p | None = None

    def set(self, k: int) -> int:
        """Rows' top-k from the next decode on (0: whole rows); the k in effect."""
        k = min(k, self.n_vocab)
        if k == self.k or not self.enabled:
            return self.k
        old = self._chain
        if old is not None:
            llama_cpp.llama_set_sampler(self._ctx, self.seq, None)
        self._chain, self.k = None, 0
        if k > 0:
            chain = llama_cpp.llama_sampler_chain_init(
                llama_cpp.llama_sampler_chain_default_params()
            )
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(k))
            # A chain is initialised for one context once: a new one each time it is set.
            if llama_cpp.llama_set_sampler(self._ctx, self.seq, chain):
                self._chain, self.k = chain, k
            else:
                llama_cpp.llama_sampler_free(chain)
        if old is not None:
            llama_cpp.llama_sampler_free(old)
        return self.k

    def rows(self, n_logits: int, first: int | None = None) -> list[TopK]:
        """The last decode's ``n_logits`` rows from batch index ``first`` (default: the last
        ``n_logits`` rows): llama.cpp keeps them a row of ``n_vocab`` apart, in output order,
        the first ``k`` of each filled (copies: the buffer is reused)."""
        ctx, k, n = self._ctx, self.k, self.n_vocab
        first = -n_logits if first is None else first
        if llama_cpp.llama_get_sampled_candidates_count_ith(ctx, first) != k:
            raise BackendError(f"llama.cpp's backend sampling gave no rows for {self.name}")
        ids = np.ctypeslib.as_array(
            llama_cpp.llama_get_sampled_candidates_ith(ctx, first), shape=(n_logits, n)
        )[:, :k].copy()
        logits = np.ctypeslib.as_array(
            llama_cpp.llama_get_sampled_logits_ith(ctx, first), shape=(n_logits, n)
        )[:, :k].copy()
        return [TopK(ids[i], logits[i], n) for i in range(n_logits)]

    def close(self) -> None:
        """Free the chain; the context that held it is freed first (or detaches it here)."""
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
