"""Tools in the Python package as vLLM has them: LLM.chat(messages, tools=...) renders OpenAI's tool
definitions, calls and results through the chat template (the default model's: fdpp's generic
Hermes-style format), the tokenizer's apply_chat_template(tools=...) renders the same, and
LLM.parse_tool_calls finds the calls in an output's text."""
from __future__ import annotations

import json

import fdpp
import pytest

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = fdpp.SamplingParams(temperature=0, max_tokens=8)


def test_chat_renders_the_tools(llm):
    tok = llm.get_tokenizer()
    assert tok.tool_call_format == "hermes"
    text = tok.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True, tools=[WEATHER])
    # The tool as json.dumps writes it, in the dict's key order, inside <tools>.
    assert "<tools>\n" + json.dumps(WEATHER) + "\n</tools>" in text
    assert text.endswith("<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n")
    plain = tok.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert "<tools>" not in plain
    (out,) = llm.chat(QUESTION, GREEDY, use_tqdm=False, tools=[WEATHER])
    assert out.prompt == text
    assert out.prompt_token_ids == tok.apply_chat_template(QUESTION, add_generation_prompt=True, tools=[WEATHER])
    assert out.outputs[0].token_ids


def test_chat_with_calls_and_results_in_the_history(llm):
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
    conv = QUESTION + [{"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    (out,) = llm.chat(conv, GREEDY, use_tqdm=False, tools=[WEATHER])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in out.prompt
    assert "<|im_start|>user\n<tool_response>\nsunny, 21 C\n</tool_response><|im_end|>" in out.prompt
    # Arguments given as a dict render the same.
    call_dict = dict(call, function={"name": "get_weather", "arguments": {"city": "Paris"}})
    tok = llm.get_tokenizer()
    same = tok.apply_chat_template([*QUESTION, {"role": "assistant", "tool_calls": [call_dict]}, conv[-1]],
                                   tokenize=False, add_generation_prompt=True, tools=[WEATHER])
    assert same == out.prompt


def test_parse_tool_calls(llm):
    content, calls = llm.parse_tool_calls(
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    assert content == "Let me check.\n"
    (call,) = calls
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert llm.parse_tool_calls("It is sunny.") == ("It is sunny.", [])
    content, calls = llm.parse_tool_calls('<tool_call>{"name": "a", "arguments": {}}</tool_call>')
    assert content is None and calls[0]["function"]["arguments"] == "{}"


@pytest.mark.parametrize("tools,words", [
    ({"type": "function"}, "tools must be a list"),
    ([{"type": "function", "function": {"description": "no name"}}], "tools\\[0\\]"),
    ([{"type": "retrieval", "function": {"name": "f"}}], "tools\\[0\\]"),
    ([{"type": "function", "function": {"name": "f", "x": object()}}], "not JSON"),
])
def test_bad_tools_are_refused(llm, tools, words):
    with pytest.raises(fdpp.InvalidInputError, match=words):
        llm.chat(QUESTION, GREEDY, use_tqdm=False, tools=tools)


def test_bad_tool_calls_are_refused(llm):
    bad_args = [*QUESTION, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{oops"}}]}]
    with pytest.raises(fdpp.InvalidInputError, match="not JSON"):
        llm.chat(bad_args, GREEDY, use_tqdm=False, tools=[WEATHER])
    with pytest.raises(fdpp.InvalidInputError, match="tool_calls\\[0\\]"):
        llm.chat([*QUESTION, {"role": "assistant", "tool_calls": [{"function": "get_weather"}]}], GREEDY,
                 use_tqdm=False)
