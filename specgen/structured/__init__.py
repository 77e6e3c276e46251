"""Structured output: grammars (JSON Schema, regex, Lark) and tool calls."""
