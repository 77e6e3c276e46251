"""The models: the registry of named pairs (``models.toml``), the Hub and package-index
downloads, GGUF headers, architectures, whether a draft fits its target, and the CPU self-test
(does this llama.cpp build run these quantization types here)."""
