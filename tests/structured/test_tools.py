"""Tool calls, pure: each family's syntax found from its template, its text parsed back into
calls (whole, and while it streams: what streams is a prefix of the whole), its grammar checked
by llguidance against the SmolLM2 vocabulary, and the conversation as templates take it."""

from __future__ import annotations

import json
import random

import pytest

from specgen.errors import UsageError
from specgen.session.chat import render_chat
from specgen.structured import tools as T

WEATHER = T.Tool(
    "get_weather",
    "The weather in a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
)
TIME = T.Tool("get_time", "", {"type": "object", "properties": {"zone": {"type": "string"}}})
TOOLS = (WEATHER, TIME)

# One answer per family: some words, then two calls in the family's own syntax.
ANSWERS = {
    "hermes": (
        'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
        '"days": 2}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
        '{"zone": "CET"}}\n</tool_call>'
    ),
    "qwen-xml": (
        "Let me look.<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n</function>\n"
        "</tool_call>"
    ),
    "mistral-nemo": (
        'Let me look.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", '
        '"days": 2}, "id": "abc123xyz"}, {"name": "get_time", "arguments": {"zone": "CET"}}]'
    ),
    "mistral": (
        'Let me look.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}'
        '[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}'
    ),
    "gemma4": (
        'Let me look.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>'
        '<|tool_call>call:get_time{zone:<|"|>CET<|"|>}<tool_call|>'
    ),
}
SYNTAX = {
    "hermes": T.Hermes(),
    "qwen-xml": T.QwenXml(),
    "mistral-nemo": T.MistralNemo(),
    "mistral": T.MistralTagged(),
    "gemma4": T.Gemma4(),
}
EXPECTED = [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {"zone": "CET"})]


@pytest.mark.parametrize(
    ("template", "name"),
    [
        ("{{ '<tool_call>' }}{% for t in tools %}{{ t | tojson }}{% endfor %}", "hermes"),
        ("<tool_call>\n<function=example_function_name>\n<parameter=x>", "qwen-xml"),
        ('<|start_header_id|>ipython ... {"name": function name, "parameters": ...}', "llama3"),
        ("[AVAILABLE_TOOLS]{{ tools }}[TOOL_CALLS]{{ c.function.name }}[ARGS]", "mistral"),
        ("[AVAILABLE_TOOLS]{{ tools }}[TOOL_CALLS][{{ calls }}]", "mistral-nemo"),
        ("<|tool>declaration:...<|tool_call>call:{{ name }}", "gemma4"),
        ("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}", "generic"),
        (None, "generic"),
    ],
)
def test_each_family_is_told_by_its_template(template, name) -> None:
    assert T.syntax_for(template).name == name


@pytest.mark.parametrize("family", sorted(ANSWERS))
def test_each_family_parses_its_calls_and_the_words_before_them(family) -> None:
    parsed = SYNTAX[family].parse(ANSWERS[family], TOOLS, final=True)
    assert parsed.content.strip() == "Let me look."
    assert [(c.name, json.loads(c.arguments or "")) for c in parsed.calls] == EXPECTED


def test_llama3_reads_a_whole_json_answer_as_a_call_and_anything_else_as_text() -> None:
    call = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'
    parsed = T.Llama3().parse(call, TOOLS, final=True)
    assert parsed.content == ""
    assert [(c.name, json.loads(c.arguments or "")) for c in parsed.calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert T.Llama3().parse("It is sunny.", TOOLS, final=True).calls == []


def test_generic_reads_calls_or_a_response() -> None:
    generic = T.Generic()
    calls = '{"tool_calls": [{"name": "get_time", "arguments": {"zone": "CET"}}]}'
    assert [c.name for c in generic.parse(calls, TOOLS, final=True).calls] == ["get_time"]
    answer = generic.parse('{"response": "It is \\"sunny\\"."}', TOOLS, final=True)
    assert (answer.content, answer.calls) == ('It is "sunny".', [])
    # while it streams, the response's text so far (whole escapes only)
    assert generic.parse('{"response": "It is \\"sun', TOOLS, final=False).content == 'It is "sun'


@pytest.mark.parametrize("family", sorted(ANSWERS))
def test_a_call_that_does_not_parse_comes_back_as_text(family) -> None:
    broken = (
        ANSWERS[family]
        .replace("Paris", 'Par"is')  # JSON
        .replace("{city:", "{city")  # Gemma 4
        .replace("</parameter>\n<parameter=days>", "<parameter=days>")  # XML
        .replace("</function>", "", 1)
    )
    plan = T.ToolPlan(SYNTAX[family], TOOLS, T.ToolChoice("auto"))
    content, calls = plan.parse(broken)
    assert content is not None and "Par" in content
    assert all(c.name != "get_weather" for c in calls)


@pytest.mark.parametrize("family", [*sorted(ANSWERS), "generic"])
@pytest.mark.parametrize("seed", range(4))
def test_what_streams_is_a_prefix_of_the_whole_answer(family, seed) -> None:
    generic = family == "generic"
    syntax = T.Generic() if generic else SYNTAX[family]
    text = (
        json.dumps({"tool_calls": [{"name": n, "arguments": a} for n, a in EXPECTED]})
        if generic
        else ANSWERS[family]
    )
    plan = T.ToolPlan(syntax, TOOLS, T.ToolChoice("auto"))
    whole_content, whole_calls = plan.parse(text)
    reader = plan.stream()
    rng = random.Random(seed)
    at, content, calls = 0, "", {}
    deltas = []
    while at < len(text):
        step = rng.randint(1, 6)
        deltas.append(reader.feed(text[at : at + step]))
        at += step
    deltas.append(reader.finish())
    for delta in deltas:
        content += delta.content
        for part in delta.tool_calls:
            entry = calls.setdefault(part["index"], {"name": None, "arguments": "", "id": None})
            if "id" in part:
                assert entry["id"] is None, "a call's header comes once"
                entry["id"], entry["name"] = part["id"], part["function"]["name"]
            entry["arguments"] += part["function"]["arguments"]
    assert content.strip() == (whole_content or "").strip()
    got = [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)]
    assert got == [(c.name, json.loads(c.arguments)) for c in whole_calls] == EXPECTED
    assert [c.id for c in reader.calls] == [calls[i]["id"] for i in sorted(calls)]
    if family == "hermes":  # JSON arguments stream in fragments, not only once whole
        assert sum(1 for d in deltas for p in d.tool_calls if p["function"]["arguments"]) > 2


RESPONSE = '{"response": "It is \\"sunny\\", 18\\u00b0C \\u2014 and dry."}'


@pytest.mark.parametrize("family", [*sorted(ANSWERS), "generic", "llama3"])
def test_scanning_on_from_where_the_text_settled_reads_as_parsing_it_all_again(family) -> None:
    syntax = {"generic": T.Generic(), "llama3": T.Llama3()}.get(family) or SYNTAX[family]
    answers = {
        "generic": [RESPONSE, '{"response": "a bad \\x escape"}'],
        "llama3": ['<|python_tag|>{"name": "get_time", "parameters": {"zone": "CET"}}'],
    }.get(family) or [ANSWERS[family], ANSWERS[family].replace("Paris", 'Par"is') + " <tool_c"]
    for text in answers:
        at, content, calls = 0, "", []
        for end in range(len(text) + 1):
            scan = syntax.scan(text[:end], at, TOOLS)
            whole = syntax.parse(text[:end], TOOLS, final=False)
            assert content + scan.parsed.content == whole.content
            assert calls + scan.parsed.calls == whole.calls
            if scan.settled > at:
                at, content = scan.settled, content + scan.parsed.content
                calls += scan.parsed.calls[: scan.whole]


@pytest.mark.parametrize("family", ["hermes", "mistral", "generic"])
def test_each_streamed_piece_reads_only_the_text_not_yet_settled(family) -> None:
    """So a stream costs what is new in each piece, not the whole answer again."""
    if family == "generic":
        opening = len('{"response": "')  # read again until it is whole; then an escape at most
        syntax, text, longest = T.Generic(), RESPONSE.replace("dry.", "dry. " * 400), opening
    else:
        # twenty answers, each calling with other arguments (a repeated call ends the answer)
        answers = (
            ANSWERS[family].replace("CET", f"CET{i:02}").replace("Paris", f"Paris{i:02}")
            for i in range(20)
        )
        syntax, text = SYNTAX[family], "".join(answers)
        # a call and its marker, and (without an end marker) the next marker that ends it
        longest = max(len(block) for block in text.split(syntax.start)) + 2 * len(syntax.start)
    unread: list[int] = []
    scan = syntax.scan

    def spy(text: str, at: int, tools):
        unread.append(len(text) - at)
        return scan(text, at, tools)

    syntax.scan = spy  # type: ignore[method-assign]
    reader = T.ToolPlan(syntax, TOOLS, T.ToolChoice("auto")).stream()
    streamed = [reader.feed(c) for c in text]
    assert len(unread) == len(text) and max(unread) <= longest < len(text) // 10
    assert sum(len(d.tool_calls) for d in streamed) >= (0 if family == "generic" else 40)


def test_tools_and_tool_choice_are_read_as_openai_sends_them() -> None:
    given = [WEATHER.as_openai(), {"type": "function", "function": {"name": "get_time"}}]
    tools = T.tools_from_request(given)
    assert [t.name for t in tools] == ["get_weather", "get_time"]
    assert tools[1].parameters == {"type": "object"}
    assert T.choice_from_request(None, tools).mode == "auto"
    assert T.choice_from_request(None, ()).mode == "none"
    named = {"type": "function", "function": {"name": "get_time"}}
    assert T.choice_from_request(named, tools) == T.ToolChoice("named", "get_time")
    for bad, said in [
        ([{"type": "retrieval"}], "type 'function'"),
        ([{"type": "function", "function": {"name": "no spaces"}}], "letters"),
        ([WEATHER.as_openai(), WEATHER.as_openai()], "two tools"),
        ({"type": "function"}, "must be a list"),
    ]:
        with pytest.raises(UsageError, match=said):
            T.tools_from_request(bad)
    with pytest.raises(UsageError, match="not one of the 'tools'"):
        T.choice_from_request({"type": "function", "function": {"name": "nope"}}, tools)
    with pytest.raises(UsageError, match="must be 'auto'"):
        T.choice_from_request("sometimes", tools)


HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call functions.\n<tools>\n"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools><|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{%- for call in message.tool_calls %}<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}'
    "\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}"
    "\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C <sunny>"},
    {"role": "tool", "tool_call_id": "call_2", "content": "and dry"},
]


def test_a_native_template_gets_the_tools_and_the_calls_as_objects() -> None:
    plan = T.ToolPlan(T.syntax_for(HERMES_TEMPLATE), TOOLS, T.ToolChoice("auto"))
    text = render_chat(HERMES_TEMPLATE, plan.messages(HISTORY), tools=plan.template_tools())
    # the schema as plain JSON (Jinja's own tojson would write \u003c for "<")
    assert json.dumps(WEATHER.as_openai()) in text
    assert '"arguments": {"city": "Paris"}}' in text  # an object, not a JSON string in a string
    assert "<tool_response>\n18 C <sunny>\n</tool_response>" in text


def test_a_template_without_tools_gets_them_described_and_the_history_as_text() -> None:
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}<|im_start|>assistant\n"
    )
    plan = T.ToolPlan(T.syntax_for(template), TOOLS, T.ToolChoice("required"))
    assert plan.template_tools() is None
    messages = plan.messages(HISTORY)
    assert messages[0]["role"] == "system" and "get_weather" in messages[0]["content"]
    assert '"response"' not in messages[0]["content"]  # required: calls only
    assert json.loads(messages[2]["content"]) == {
        "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    }
    # the two results are one user turn (templates that alternate roles refuse two)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert "18 C <sunny>" in messages[3]["content"] and "and dry" in messages[3]["content"]


CHATML_WITHOUT_TOOLS = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}<|im_start|>assistant\n"
)


def turn(ident: str, city: str, result: str) -> list[dict]:
    """One turn of an agent loop: a call to get_weather with the client's id, and its result."""
    call = {"name": "get_weather", "arguments": json.dumps({"city": city})}
    return [
        {"role": "assistant", "content": None, "tool_calls": [{"id": ident, "function": call}]},
        {"role": "tool", "tool_call_id": ident, "content": result},
    ]


def test_a_call_repeated_with_the_same_result_is_shown_once_to_a_template_without_tools() -> None:
    """As an agent loop sends it: the call ids are the client's, the results name no function."""
    template = CHATML_WITHOUT_TOOLS
    ask = [{"role": "user", "content": "The weather in Paris?"}]
    history = [
        *ask,
        *turn("call_a", "Paris", "18 C"),
        *turn("call_b", "Paris", "18 C"),  # the same call, the same result: shown once
        *turn("call_c", "Paris", "19 C"),  # the same call, a new result (polling): kept
        *turn("call_d", "Rome", "18 C"),
    ]
    plan = T.ToolPlan(T.syntax_for(template), TOOLS, T.ToolChoice("auto"))
    messages = plan.messages(history)
    results = [m["content"] for m in messages if m["role"] == "user"][1:]
    assert results == [
        "The result of get_weather: 18 C",  # named by the call it answers, not by its id
        "The result of get_weather: 19 C",
        "The result of get_weather: 18 C",
    ]
    calls = [json.loads(m["content"]) for m in messages if m["role"] == "assistant"]
    cities = [c["tool_calls"][0]["arguments"]["city"] for c in calls]
    assert cities == ["Paris", "Paris", "Rome"]
    # a native template gets the conversation as the client sent it
    native = T.ToolPlan(T.syntax_for(HERMES_TEMPLATE), TOOLS, T.ToolChoice("auto"))
    assert len(native.messages(history)) == len(history)
    assert native.after(history[:5]) is native


def test_a_model_that_repeats_its_last_call_is_told_to_answer_and_can_only_answer() -> None:
    """An agent loop with a fixed seed: the collapsed prompt is the prompt it had, so the model
    would call again every turn. After a repeat, the answer is an answer."""
    template = CHATML_WITHOUT_TOOLS
    ask = [{"role": "user", "content": "The weather in Paris?"}]
    plan = T.ToolPlan(T.syntax_for(template), TOOLS, T.ToolChoice("auto"))
    once = [*ask, *turn("a", "Paris", "18 C")]
    assert plan.after(once) is plan  # one call and its result: the model may call again
    moved_on = [*once, *turn("b", "Paris", "18 C"), *turn("c", "Rome", "20 C")]
    assert plan.after(moved_on) is plan  # the repeat was not the last turn
    polled = [*once, *turn("b", "Paris", "19 C")]
    assert plan.after(polled) is plan  # a new result is news
    looped = [*once, *turn("b", "Paris", "18 C")]
    answer = plan.after(looped)
    assert answer.answer and answer.active
    system = answer.messages(looped)[0]["content"]
    assert "Answer now" in system and '"tool_calls"' not in system
    grammar = answer.grammar()
    assert grammar is not None and "tool_calls" not in grammar.text
    # what the client asked for otherwise is not overridden
    required = T.ToolPlan(T.syntax_for(template), TOOLS, T.ToolChoice("required"))
    assert required.after(looped) is required


# -- grammars, checked by llguidance on a real vocabulary ------------------------------------


@pytest.fixture(scope="module")
def vocab(smollm2_draft):
    from specgen.backend import LlamaModel, ModelOptions

    model = LlamaModel(smollm2_draft, ModelOptions(n_ctx=64, n_threads=1))
    return model, model.tokenizer()


def accepts(vocab, grammar, text: str, markers=None) -> bool:
    """Whether ``grammar`` takes the whole of ``text`` and may end there."""
    from llguidance import LLMatcher

    model, tokenizer = vocab
    tokens = model.tokenize(text, add_special=False, parse_special=True)
    for marker, token in (markers or {}).items():  # the marker as its one token
        spelled = model.tokenize(marker, add_special=False, parse_special=False)
        for i in range(len(tokens) - len(spelled), -1, -1):
            if tokens[i : i + len(spelled)] == spelled:
                tokens[i : i + len(spelled)] = [token]
    matcher = LLMatcher(tokenizer, grammar.compiled(), log_level=0)
    return matcher.validate_tokens(tokens) == len(tokens) and (
        matcher.consume_tokens(tokens) and matcher.is_accepting()
    )


@pytest.mark.parametrize("family", sorted(ANSWERS))
def test_each_grammar_takes_its_own_calls_and_refuses_others(vocab, family) -> None:
    syntax, answer = SYNTAX[family], ANSWERS[family]
    calls_only = answer.removeprefix("Let me look.")
    if family == "qwen-xml":  # its grammar writes the newline after each block it closes
        calls_only = calls_only.replace("</function>\n</tool_call>\n", "</function>\n</tool_call>")
    auto = T.ToolPlan(syntax, TOOLS, T.ToolChoice("auto")).grammar()
    required = T.ToolPlan(syntax, TOOLS, T.ToolChoice("required")).grammar()
    one = T.ToolPlan(syntax, TOOLS, T.ToolChoice("required"), parallel=False).grammar()
    named = T.ToolPlan(syntax, TOOLS, T.ToolChoice("named", "get_time")).grammar()
    assert accepts(vocab, auto, answer)
    assert accepts(vocab, auto, "No call needed: it is sunny.")
    assert accepts(vocab, required, calls_only)
    assert not accepts(vocab, required, "No call needed: it is sunny.")
    if family != "mistral-nemo":  # one list holds all calls
        first = calls_only[: calls_only.index(syntax.start, 1)]
        assert accepts(vocab, one, first.rstrip("\n") if family != "qwen-xml" else first)
    assert not accepts(vocab, one, calls_only)
    assert not accepts(vocab, named, calls_only)  # get_weather is not the named one
    # a wrong argument type, or a misspelt tool, is refused
    assert not accepts(vocab, required, calls_only.replace("get_weather", "get_wether"))
    if family not in ("qwen-xml", "gemma4"):  # JSON arguments are checked against the schema
        assert not accepts(vocab, required, calls_only.replace('"days": 2', '"days": "two"'))


def test_llama3_and_generic_grammars(vocab) -> None:
    call = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    llama = T.ToolPlan(T.Llama3(), TOOLS, T.ToolChoice("auto")).grammar()
    assert accepts(vocab, llama, call) and accepts(vocab, llama, "It is sunny.")
    assert not accepts(vocab, llama, '{"name": "get_weather", "parameters": {}}')
    generic = T.ToolPlan(T.Generic(), TOOLS, T.ToolChoice("auto")).grammar()
    required = T.ToolPlan(T.Generic(), TOOLS, T.ToolChoice("required")).grammar()
    calls = '{"tool_calls": [{"name": "get_time", "arguments": {"zone": "CET"}}]}'
    assert accepts(vocab, generic, calls) and accepts(vocab, required, calls)
    assert accepts(vocab, generic, '{"response": "sunny"}')
    assert not accepts(vocab, required, '{"response": "sunny"}')


def test_markers_the_vocabulary_holds_as_special_tokens_must_be_those_tokens(vocab) -> None:
    from specgen.session.generate import special_tokens

    model, _ = vocab
    found = special_tokens(model, ["<|im_start|>", "<tool_call>", "hello"])
    assert found == {"<|im_start|>": 1}
    # As if "<tool_call>" were that special token: the grammar then takes the token, not
    # the same text spelt out in pieces.
    markers = {"<tool_call>": 1}
    grammar = T.ToolPlan(T.Hermes(), TOOLS, T.ToolChoice("required"), markers=markers).grammar()
    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    assert accepts(vocab, grammar, call, markers)
    assert not accepts(vocab, grammar, call)


def test_a_tool_schema_that_gives_no_grammar_is_one_line() -> None:
    bad = T.Tool("f", "", {"type": "object", "properties": {"x": {"type": "no-such-type"}}})
    with pytest.raises(UsageError, match="the tools' schemas give no usable grammar"):
        T.ToolPlan(T.Hermes(), (bad,), T.ToolChoice("required")).grammar()


HERMES_CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s", "days": 2}}\n</tool_call>'
)
GENERIC_CALL = '{"name": "get_weather", "arguments": {"city": "%s", "days": 2}}'


def answer_of(family: str, cities: list[str], cut: int = 0) -> str:
    """An answer of calls to get_weather, one per city, less its last ``cut`` characters."""
    if family == "generic":
        text = '{"tool_calls": [' + ", ".join(GENERIC_CALL % c for c in cities) + "]}"
    else:
        text = "\n".join(HERMES_CALL % c for c in cities)
    return text[: len(text) - cut]


def read_streaming(syntax, text: str, seed: int, cut: bool = False):
    """The reader, the deltas' calls put together, as the server streams ``text`` (it stops
    feeding once the reader says the answer repeated itself)."""
    reader = T.ToolPlan(syntax, TOOLS, T.ToolChoice("required")).stream()
    rng, at, deltas = random.Random(seed), 0, []
    while at < len(text) and not reader.repeated:
        step = rng.randint(1, 6)
        deltas.append(reader.feed(text[at : at + step]))
        at += step
    deltas.append(reader.finish(cut=cut))
    calls: dict[int, dict] = {}
    for delta in deltas:
        for part in delta.tool_calls:
            entry = calls.setdefault(part["index"], {"arguments": ""})
            entry["name"] = part["function"].get("name", entry.get("name"))
            entry["arguments"] += part["function"]["arguments"]
    return reader, [(calls[i]["name"], loose(calls[i]["arguments"])) for i in sorted(calls)]


def loose(arguments: str) -> object:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments  # a call cut while it streamed


@pytest.mark.parametrize("family", ["hermes", "generic"])
@pytest.mark.parametrize("seed", range(3))
def test_a_call_that_repeats_an_earlier_one_ends_the_answer_unsent(family, seed) -> None:
    syntax = T.Generic() if family == "generic" else T.Hermes()
    text = answer_of(family, ["Paris"] * 6)
    reader, streamed = read_streaming(syntax, text, seed)
    assert reader.repeated and len(reader.text) < len(text) * 0.5, "it stopped at the repeat"
    paris = ("get_weather", {"city": "Paris", "days": 2})
    assert streamed == [paris] == [(c.name, json.loads(c.arguments)) for c in reader.calls]
    # a call that only begins as an earlier one did is held back, then sent whole
    reader, streamed = read_streaming(syntax, answer_of(family, ["Paris", "Parma"]), seed)
    assert not reader.repeated
    assert streamed == [paris, ("get_weather", {"city": "Parma", "days": 2})]
    # the whole text, read at once, keeps the calls up to the repeat
    content, calls = T.ToolPlan(syntax, TOOLS, T.ToolChoice("required")).parse(text)
    assert content is None and [json.loads(c.arguments)["city"] for c in calls] == ["Paris"]


@pytest.mark.parametrize("family", ["hermes", "generic"])
def test_a_cut_answer_keeps_its_finished_calls_and_drops_the_one_being_written(family) -> None:
    syntax = T.Generic() if family == "generic" else T.Hermes()
    text = answer_of(family, ["Paris", "Rome", "Oslo"], cut=len('slo", "days": 2}}\n</tool_call>'))
    plan = T.ToolPlan(syntax, TOOLS, T.ToolChoice("required"))
    content, calls = plan.parse(text, cut=True)
    assert content is None
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Paris", "Rome"]
    reader, streamed = read_streaming(syntax, text, seed=0, cut=True)
    assert [json.loads(c.arguments)["city"] for c in reader.calls] == ["Paris", "Rome"]
    # while streaming, the one being written may have begun: the client is told by "length"
    assert [a["city"] for _, a in streamed[:2]] == ["Paris", "Rome"]


def test_a_tool_takes_only_the_arguments_it_declares_unless_its_schema_says_otherwise(
    vocab,
) -> None:
    open_tool = T.Tool("f", "", {"type": "object", "properties": {"a": {"type": "integer"}}})
    extra = '<tool_call>\n{"name": "f", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    closed = T.ToolPlan(T.Hermes(), (open_tool,), T.ToolChoice("required")).grammar()
    assert not accepts(vocab, closed, extra)
    assert accepts(vocab, closed, extra.replace(', "b": 2', ""))
    said = T.Tool("f", "", {**open_tool.parameters, "additionalProperties": True})
    opened = T.ToolPlan(T.Hermes(), (said,), T.ToolChoice("required")).grammar()
    assert accepts(vocab, opened, extra)


WEIRD = [
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"properties": 5}}}]},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
    {"tools": [{"type": "function", "function": "f"}]},
    {"tools": "f"},
    {"tool_choice": {"type": "function"}},
    {"tool_choice": 5},
    {"tool_choice": "none", "messages": [{"role": "assistant", "tool_calls": ["x"]}]},
    {"tool_choice": "none", "messages": [{"role": "assistant", "tool_calls": [{"function": "s"}]}]},
    {
        "tool_choice": "none",
        "messages": [
            {"role": "assistant", "tool_calls": [{"function": {"name": 5, "arguments": 7}}]},
            {"role": "tool", "content": [{"type": "text", "text": "a result"}]},
        ],
    },
    {"tool_choice": "none", "messages": [{"role": "tool"}]},
    {"parallel_tool_calls": "yes"},
]


@pytest.mark.parametrize("extra", WEIRD)
def test_odd_tool_requests_are_answered_never_a_500(fake_pair, extra) -> None:
    import asyncio

    import httpx2 as httpx

    from specgen.api import Specgen
    from specgen.server import create_app

    app = create_app(Specgen(target=fake_pair.target, draft=fake_pair.draft), max_queue=0)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    body = {**body, "tools": [WEATHER.as_openai()], **extra}

    async def post() -> httpx.Response:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://specgen"
        ) as http:
            return await http.post("/v1/chat/completions", json=body)

    reply = asyncio.run(post())
    assert reply.status_code < 500, reply.text
    if reply.status_code >= 400:
        assert reply.json()["error"]["message"]
