"""Command-line options shared by several commands, declared once as ``Annotated`` aliases."""

from __future__ import annotations

from typing import Annotated

import typer

from specgen.core.speculative import MAX_LOOKAHEAD, Lookahead, parse_lookahead

MODELS, SAMPLING, OUTPUT, PERFORMANCE = "Models", "Sampling", "Output", "Performance"


def _lookahead(text: str) -> Lookahead:
    try:
        return parse_lookahead(text)
    except ValueError as err:
        raise typer.BadParameter(f"{text!r} is not 'auto' or a K from 0 to {MAX_LOOKAHEAD}")\
            from err


PairOpt = Annotated[str | None, typer.Option(
    "--pair", "-p", help="A named draft/target pair from models.toml (default: the default pair; "
    "see `specgen models list`).", show_default=False, rich_help_panel=MODELS)]
TargetOpt = Annotated[str | None, typer.Option(
    "--target", "-m", help="Target model: a GGUF path, org/repo:file.gguf, or PAIR:target.",
    show_default=False, rich_help_panel=MODELS)]
DraftOpt = Annotated[str | None, typer.Option(
    "--draft", "-md", help="Draft model: a GGUF path, org/repo:file.gguf, or PAIR:draft; or "
    "'ngram' to draft by prompt lookup with no draft model (a file named so: ./ngram).",
    show_default=False, rich_help_panel=MODELS)]
# Typer has no Union types: the parser turns the text into a Lookahead (an int, or "auto").
LookaheadOpt = Annotated[str | None, typer.Option(
    "--lookahead", "-k", parser=_lookahead, metavar="K|auto",
    help="Guesses per cycle, K: a number (0: the target alone), or 'auto' to choose K before "
    "each cycle from the acceptance and costs measured so far, turning speculation off when it "
    "cannot pay (default: the pair's own).", show_default=False, rich_help_panel=MODELS)]
NgramOpt = Annotated[bool | None, typer.Option(
    "--ngram/--no-ngram", help="Also draft by prompt lookup beside the draft model (hybrid): "
    "free guesses where the text repeats its input (default: the pair's own setting).",
    show_default=False, rich_help_panel=MODELS)]
DraftPMinOpt = Annotated[float, typer.Option(
    "--draft-p-min", min=0.0, max=0.99, help="Stop drafting a cycle when the draft's top "
    "probability falls below this (0: always draft K). Exactness is kept.",
    rich_help_panel=MODELS)]
TemperatureOpt = Annotated[float, typer.Option(
    "--temperature", "--temp", help="Sampling temperature; 0 is greedy.",
    rich_help_panel=SAMPLING)]
TopKOpt = Annotated[int, typer.Option(
    "--top-k", help="Keep the k most likely tokens (0: off).", rich_help_panel=SAMPLING)]
TopPOpt = Annotated[float, typer.Option(
    "--top-p", help="Nucleus: smallest set with this mass.", rich_help_panel=SAMPLING)]
MinPOpt = Annotated[float, typer.Option(
    "--min-p", help="Drop tokens below min-p x the best.", rich_help_panel=SAMPLING)]
SeedOpt = Annotated[int | None, typer.Option(
    "--seed", "-s", help="Random seed (default: random; printed with the stats).",
    show_default=False, rich_help_panel=SAMPLING)]
MaxTokensOpt = Annotated[int, typer.Option(
    "--max-tokens", "-n", min=1, help="Stop after this many new tokens.",
    rich_help_panel=SAMPLING)]
ThreadsOpt = Annotated[int, typer.Option(
    "--threads", "-t", min=0, help="CPU threads for both models (0: physical cores).",
    rich_help_panel=PERFORMANCE)]
CtxOpt = Annotated[int, typer.Option(
    "--ctx-size", "-c", min=0, help="Context window in tokens (0: min(4096, trained)).",
    rich_help_panel=PERFORMANCE)]
GpuLayersOpt = Annotated[int, typer.Option(
    "--gpu-layers", "-ngl", help="Layers of each model to offload to the GPU (-1: all; "
    "ignored by CPU builds).", rich_help_panel=PERFORMANCE)]
VerboseOpt = Annotated[bool, typer.Option(
    "--verbose", "-v", help="Show llama.cpp's own logs.", rich_help_panel=OUTPUT)]
