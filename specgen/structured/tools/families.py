"""Every family of tool-call syntax, and which one a chat template teaches."""

from __future__ import annotations

from specgen.structured.tools.gemma4 import Gemma4
from specgen.structured.tools.generic import Generic
from specgen.structured.tools.hermes import Hermes
from specgen.structured.tools.llama3 import Llama3
from specgen.structured.tools.mistral import MistralNemo, MistralTagged
from specgen.structured.tools.qwen_xml import QwenXml
from specgen.structured.tools.syntax import Syntax

SYNTAXES: tuple[type[Syntax], ...] = (Gemma4, MistralTagged, MistralNemo, QwenXml, Hermes, Llama3)


def syntax_for(template: str | None) -> Syntax:
    """The tool-call syntax a chat template teaches (by its markers, as llama.cpp tells them
    apart), or the generic JSON form when it teaches none."""
    text = template or ""
    if "<|tool_call>" in text:
        return Gemma4()
    if "[TOOL_CALLS]" in text:
        return MistralTagged() if "[ARGS]" in text else MistralNemo()
    if "<tool_call>" in text:
        return QwenXml() if "<function=" in text else Hermes()
    if "<|start_header_id|>" in text and ("<|python_tag|>" in text or '"parameters"' in text):
        return Llama3()
    return Generic()
