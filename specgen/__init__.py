"""specgen: fast local text generation with speculative decoding on llama.cpp."""

__version__ = "0.2.0"
