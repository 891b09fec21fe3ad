"""Tools (function calling) through fdpp serve with the clients apps use: the openai SDK's weather
round trip (a forced call whose arguments are JSON for the schema, its result sent back as a tool
message, then an answer), "required" with several tools, streamed tool-call deltas assembled by
the SDK's stream helper, langchain-openai's bind_tools, and the 400s of malformed tools. The
default model's template has no tool syntax: fdpp renders its generic (Qwen2.5-style) format."""
import json

import httpx
import openai
import pytest

from conftest import start  # noqa: F401  (the module's server fixture is conftest's)

WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 40}},
                   "required": ["zone"], "additionalProperties": False}}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def check_weather_arguments(text):
    args = json.loads(text)
    assert set(args) == {"city", "unit"}, args
    assert isinstance(args["city"], str) and len(args["city"]) <= 40
    assert args["unit"] in ("celsius", "fahrenheit")
    return args


def test_weather_round_trip(server):
    c = client(server)
    forced = {"type": "function", "function": {"name": "get_weather"}}
    r = c.chat.completions.create(model=server.model_id, messages=QUESTION, tools=[WEATHER, TIME], tool_choice=forced,
                                  temperature=0, max_tokens=80)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert call.id.startswith("call_") and len(call.id) > 10
    check_weather_arguments(call.function.arguments)

    # The call and its result go back; the model answers in text.
    messages = QUESTION + [choice.message, {"role": "tool", "tool_call_id": call.id,
                                            "content": json.dumps({"temperature_c": 21, "sky": "clear"})}]
    r2 = c.chat.completions.create(model=server.model_id, messages=messages, tools=[WEATHER, TIME], tool_choice="none",
                                   temperature=0, max_tokens=40)
    answer = r2.choices[0]
    assert answer.message.tool_calls is None
    assert answer.finish_reason in ("stop", "length")
    assert answer.message.content and answer.message.content.strip()
    # The prompt held the call and its result, in the generic format (/tokenize renders the same).
    sent = QUESTION + [choice.message.model_dump(exclude_none=True), messages[-1]]
    tok = httpx.post(server.url + "/tokenize", timeout=30,
                     json={"messages": sent, "tools": [WEATHER, TIME], "tool_choice": "none"}).json()
    assert tok["count"] == r2.usage.prompt_tokens
    text = httpx.post(server.url + "/detokenize", json={"tokens": tok["tokens"]}, timeout=30).json()["prompt"]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {' in text
    assert '<tool_response>\n{"temperature_c": 21, "sky": "clear"}\n</tool_response>' in text


def test_required_picks_a_defined_tool(server):
    c = client(server)
    r = c.chat.completions.create(model=server.model_id, messages=[{"role": "user", "content": "What time is it in Tokyo?"}],
                                  tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False,
                                  temperature=0, max_tokens=80)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        check_weather_arguments(call.function.arguments)
    else:
        assert call.function.name == "get_time" and set(args) == {"zone"}, call


def test_streamed_tool_call_deltas(server):
    c = client(server)
    kw = dict(model=server.model_id, messages=QUESTION, tools=[WEATHER], temperature=0, max_tokens=80,
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    # The raw chunks: the first tool_calls delta has the id, type and name; the arguments follow.
    deltas, finish = [], None
    for chunk in c.chat.completions.create(stream=True, **kw):
        if chunk.choices:
            delta = chunk.choices[0].delta
            deltas += delta.tool_calls or []
            assert not delta.content
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert len(deltas) > 1, "the arguments stream in pieces"
    assert deltas[0].id and deltas[0].type == "function" and deltas[0].function.name == "get_weather"
    assert all(d.index == 0 and d.id is None for d in deltas[1:])
    streamed = "".join(d.function.arguments or "" for d in deltas)
    check_weather_arguments(streamed)
    # The SDK's stream helper assembles them into the same call as the whole answer.
    with c.chat.completions.stream(**kw) as stream:
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == json.loads(streamed)
    whole = c.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    assert json.loads(whole.function.arguments) == json.loads(streamed)


# A call in the generic (Hermes) syntax after some text. The 135M default model does not write
# calls on its own, so guided_regex holds it to one: what is tested is the server's parsing of a
# call the model wrote (tool_choice "auto"), whole and streamed.
WRITTEN_CALL = (r'Checking\. <tool_call>\n\{"name": "get_weather", "arguments": '
                r'\{"city": "[A-Z][a-z]{2,10}", "unit": "celsius"\}\}\n</tool_call>')


def test_auto_parses_the_call_the_model_writes(server):
    c = client(server)
    kw = dict(model=server.model_id, messages=QUESTION, tools=[WEATHER], temperature=0, max_tokens=80,
              extra_body={"guided_regex": WRITTEN_CALL})
    r = c.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content == "Checking. "
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    check_weather_arguments(call.function.arguments)
    # Streamed: the text before the call as content deltas, then the call.
    content, calls, finish = "", [], None
    for chunk in c.chat.completions.create(stream=True, **kw):
        if chunk.choices:
            delta = chunk.choices[0].delta
            content += delta.content or ""
            calls += delta.tool_calls or []
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert content == "Checking. "
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].id.startswith("call_")
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == json.loads(call.function.arguments)
    # parallel_tool_calls false with two calls written: the first only.
    two = WRITTEN_CALL + r'\n<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "Oslo", "unit": "celsius"\}\}\n</tool_call>'
    r = c.chat.completions.create(**{**kw, "extra_body": {"guided_regex": two}})
    assert len(r.choices[0].message.tool_calls) == 2
    r = c.chat.completions.create(**{**kw, "extra_body": {"guided_regex": two}}, parallel_tool_calls=False)
    assert len(r.choices[0].message.tool_calls) == 1


def test_tools_reach_the_template(server):
    # /tokenize renders the chat as /v1/chat/completions does: the tools' names and schemas are in
    # the prompt in the generic format, and tool_choice "none" leaves them out.
    body = {"messages": QUESTION, "tools": [WEATHER]}
    with_tools = httpx.post(server.url + "/tokenize", json=body, timeout=30).json()
    without = httpx.post(server.url + "/tokenize", json={**body, "tool_choice": "none"}, timeout=30).json()
    assert with_tools["count"] > without["count"] + 50
    text = httpx.post(server.url + "/detokenize", json={"tokens": with_tools["tokens"]}, timeout=30).json()["prompt"]
    assert "<tools>" in text and '"name": "get_weather"' in text and "<tool_call>" in text


def test_auto_and_none_answer_in_text_or_calls(server):
    # tool_choice "auto": whatever the model writes is either content or well-formed calls.
    c = client(server)
    r = c.chat.completions.create(model=server.model_id, messages=QUESTION, tools=[WEATHER], temperature=0,
                                  max_tokens=60)
    m = r.choices[0].message
    if m.tool_calls:
        assert r.choices[0].finish_reason == "tool_calls"
        for call in m.tool_calls:
            json.loads(call.function.arguments)
    else:
        assert m.content is not None and r.choices[0].finish_reason in ("stop", "length")
    r = c.chat.completions.create(model=server.model_id, messages=QUESTION, tools=[WEATHER], tool_choice="none",
                                  temperature=0, max_tokens=8)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content is not None


def test_langchain_bind_tools(server):
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return f"It is sunny in {city}."

    @tool
    def get_time(zone: str) -> str:
        """The local time in a time zone."""
        return "12:00"

    chat = langchain_openai.ChatOpenAI(base_url=server.url + "/v1", api_key="none", model=server.model_id,
                                       temperature=0, max_tokens=80, max_retries=0)
    question = HumanMessage("What is the weather in Paris?")
    msg = chat.bind_tools([get_weather, get_time], tool_choice="get_weather").invoke([question])
    assert len(msg.tool_calls) == 1, msg
    call = msg.tool_calls[0]
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str) and call["id"]
    # "any" is OpenAI's "required": one of the tools, with its arguments.
    msg_any = chat.bind_tools([get_weather, get_time], tool_choice="any", parallel_tool_calls=False).invoke([question])
    assert len(msg_any.tool_calls) == 1 and msg_any.tool_calls[0]["name"] in ("get_weather", "get_time")
    # The tool's result goes back as a ToolMessage; the model answers.
    result = get_weather.invoke(call["args"])
    answer = chat.bind_tools([get_weather, get_time], tool_choice="none").invoke(
        [question, msg, ToolMessage(result, tool_call_id=call["id"])])
    assert answer.content and not answer.tool_calls
    # Streamed, LangChain joins the tool-call chunks itself.
    chunks = None
    for chunk in chat.bind_tools([get_weather], tool_choice="get_weather").stream([question]):
        chunks = chunk if chunks is None else chunks + chunk
    assert chunks.tool_calls and chunks.tool_calls[0]["name"] == "get_weather"
    assert isinstance(chunks.tool_calls[0]["args"]["city"], str)


BAD = [
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "an object"}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}, "tools[0].function.parameters"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_stock_price"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [], "tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [WEATHER], "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                         "function": {"name": "f", "arguments": "{not json"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
]


@pytest.mark.parametrize("fields,param", BAD)
def test_malformed_tools_are_a_400_naming_the_field(server, fields, param):
    body = {"messages": QUESTION, "max_tokens": 4, **fields}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert err["type"] == "invalid_request_error" and err["message"]
    # The openai client raises it as a BadRequestError.
    with pytest.raises(openai.BadRequestError):
        client(server).chat.completions.create(model=server.model_id, **body)
