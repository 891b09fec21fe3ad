"""Structured output through fdpp serve with the official openai client, as apps use it:
response_format with a pydantic model (client.beta.chat.completions.parse where the SDK has it),
json_object, vLLM's guided_* and structured_outputs fields in extra_body, streaming, and a schema
keyword the engine cannot honour refused by name. The outputs are parsed, not compared with text."""
import json
import re

import httpx
import openai
import pydantic
import pytest

from conftest import start  # noqa: F401  (the module's server fixture is conftest's)


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    age: int
    likes_tea: bool


def _parse(c, **kw):
    # openai 1.x: client.beta.chat.completions.parse; newer SDKs moved it to client.chat.completions.
    beta = getattr(getattr(c, "beta", None), "chat", None)
    return (beta.completions if beta is not None else c.chat.completions).parse(**kw)


def test_pydantic_response_format_parses(server):
    c = client(server)
    r = _parse(c, model=server.model_id, response_format=Person, temperature=0, max_tokens=120,
               messages=[{"role": "user", "content": "Describe a person: name, age and whether they like tea."}])
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(choice.message.parsed, Person)
    assert len(choice.message.parsed.name) <= 20
    assert list(json.loads(choice.message.content)) == ["name", "age", "likes_tea"]


def test_json_object_streamed(server):
    c = client(server)
    stream = c.chat.completions.create(model=server.model_id, stream=True, temperature=0, max_tokens=150,
                                       response_format={"type": "json_object"},
                                       messages=[{"role": "user", "content": 'What is the capital of France? '
                                                  'Answer as JSON: {"capital": ...}'}])
    text, finish = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop", text
    assert isinstance(json.loads(text), dict)


def test_vllm_guided_fields(server):
    c = client(server)
    choices = ["red", "green", "blue"]
    r = c.chat.completions.create(model=server.model_id, temperature=0, max_tokens=10,
                                  messages=[{"role": "user", "content": "Pick a color."}],
                                  extra_body={"guided_choice": choices})
    assert r.choices[0].message.content in choices
    r = c.completions.create(model=server.model_id, prompt="The year was", temperature=0.8, seed=1, max_tokens=12,
                             extra_body={"guided_regex": "1[89][0-9]{2}"})
    assert re.fullmatch("1[89][0-9]{2}", r.choices[0].text), r.choices[0].text
    r = c.chat.completions.create(model=server.model_id, temperature=0, max_tokens=60,
                                  messages=[{"role": "user", "content": "List two fruits."}],
                                  extra_body={"structured_outputs": {"json": {
                                      "type": "array", "items": {"type": "string", "maxLength": 12},
                                      "minItems": 2, "maxItems": 2}}})
    fruits = json.loads(r.choices[0].message.content)
    assert len(fruits) == 2 and all(isinstance(f, str) and len(f) <= 12 for f in fruits)


def test_unsupported_schema_keyword_is_a_400_naming_it(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=server.model_id, max_tokens=5, messages=[{"role": "user", "content": "x"}],
                                  response_format={"type": "json_schema", "json_schema": {
                                      "name": "n", "schema": {"type": "integer", "exclusiveMinimum": 0}}})
    assert "exclusiveMinimum" in str(e.value)
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": "x"}], "guided_json": {"type": "string", "format": "ipv4"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "guided_json"
    assert "ipv4" in r.json()["error"]["message"]


def test_langchain_with_structured_output(server):
    # LangChain's with_structured_output (langchain-openai, method "json_schema": response_format
    # with the pydantic model's strict schema) returns the model itself.
    langchain_openai = pytest.importorskip("langchain_openai")
    chat = langchain_openai.ChatOpenAI(base_url=server.url + "/v1", api_key="none", model=server.model_id,
                                       temperature=0, max_tokens=120, max_retries=0)
    person = chat.with_structured_output(Person).invoke("Describe a person: name, age and whether they like tea.")
    assert isinstance(person, Person) and len(person.name) <= 20
