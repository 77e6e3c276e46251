"""Pure math of speculative decoding: no llama_cpp, no rich, no I/O.

Notation follows the seed text: ``p`` is the target's distribution, ``q`` the draft's,
``K`` the lookahead, ``alpha`` the per-token acceptance rate.
"""
