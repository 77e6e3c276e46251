"""Tool calls: OpenAI's ``tools`` and ``tool_choice`` for local models, in each model's own syntax.

A model calls tools in the syntax its chat template taught it (Hermes/Qwen ``<tool_call>`` JSON,
Qwen3.5's XML, Llama 3's bare JSON, Mistral's ``[TOOL_CALLS]``, Gemma 4's ``<|tool_call>``); a
template without tools gets a generic JSON answer under a grammar, as llama-server does. This
package owns, per syntax: which templates use it, the grammar that keeps a call well formed (the
arguments under each tool's JSON Schema where the syntax is JSON), and the parser that turns the
model's text back into OpenAI ``tool_calls``, whole or while it streams (``ToolStream``).

``tool_choice``: ``auto`` lets the model answer or call (the grammar is lazy: free text until a
call begins, then the call's syntax); ``required`` and a named function must call (the grammar
starts with the call); ``none`` renders no tools. A call that does not parse comes back as text.

Pure: no llama.cpp and no server. The markers a vocabulary holds as single special tokens are
given by the caller (``ToolPlan.markers``), so the grammar writes them as those tokens.

The modules: ``request`` (what a request asks for), ``syntax`` (what a family is, and the
block shape most share), ``json_calls`` (calls written as JSON), one module per family
(``hermes``, ``qwen_xml``, ``llama3``, ``mistral``, ``gemma4``, ``generic``), ``families``
(which one a template teaches), ``plan`` (one request's tools) and ``stream`` (an answer's
calls while it streams). Import from here.
"""

from specgen.structured.tools.families import SYNTAXES, syntax_for
from specgen.structured.tools.gemma4 import Gemma4
from specgen.structured.tools.generic import Generic
from specgen.structured.tools.hermes import Hermes
from specgen.structured.tools.llama3 import Llama3
from specgen.structured.tools.mistral import MistralNemo, MistralTagged
from specgen.structured.tools.plan import ToolPlan
from specgen.structured.tools.qwen_xml import QwenXml
from specgen.structured.tools.request import (
    Mode,
    Tool,
    ToolCall,
    ToolChoice,
    choice_from_request,
    new_call_id,
    tools_from_request,
)
from specgen.structured.tools.stream import Delta, ToolStream
from specgen.structured.tools.syntax import BlockSyntax, Call, Parsed, Scan, Syntax

__all__ = [
    "SYNTAXES",
    "BlockSyntax",
    "Call",
    "Delta",
    "Gemma4",
    "Generic",
    "Hermes",
    "Llama3",
    "MistralNemo",
    "MistralTagged",
    "Mode",
    "Parsed",
    "QwenXml",
    "Scan",
    "Syntax",
    "Tool",
    "ToolCall",
    "ToolChoice",
    "ToolPlan",
    "ToolStream",
    "choice_from_request",
    "new_call_id",
    "syntax_for",
    "tools_from_request",
]
