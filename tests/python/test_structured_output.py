"""Structured output from Python as vLLM users write it: SamplingParams(structured_outputs=
StructuredOutputsParams(...)) and the older guided_decoding=GuidedDecodingParams(...), on the
default model. The outputs are checked by parsing them, not against fixed text."""
from __future__ import annotations

import json
import re

import fdpp
import pytest
from fdpp import GuidedDecodingParams, StructuredOutputsParams

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "likes_tea": {"type": "boolean"},
    },
    "required": ["name", "age", "likes_tea"],
    "additionalProperties": False,
}


def _chat(llm, question, params):
    (out,) = llm.chat([{"role": "user", "content": question}], params, use_tqdm=False)
    return out.outputs[0]


def test_json_schema_output_parses_and_validates(llm):
    sp = fdpp.SamplingParams(temperature=0, max_tokens=120,
                             structured_outputs=StructuredOutputsParams(json=SCHEMA))
    o = _chat(llm, "Describe a person as JSON with name, age and likes_tea.", sp)
    assert o.finish_reason == "stop", o.text
    value = json.loads(o.text)
    assert list(value) == ["name", "age", "likes_tea"]  # the schema's order
    assert isinstance(value["name"], str) and len(value["name"]) <= 20
    assert isinstance(value["age"], int) and isinstance(value["likes_tea"], bool)


def test_sampled_json_object_and_guided_choice(llm):
    # Sampled (temperature 1), several seeds: every output is still a JSON object.
    for seed in range(3):
        sp = fdpp.SamplingParams(temperature=1.0, seed=seed, max_tokens=200,
                                 guided_decoding=GuidedDecodingParams(json_object=True))
        o = _chat(llm, "Give me a JSON object about cats.", sp)
        if o.finish_reason == "length":
            continue  # cut by max_tokens: not a complete object, and not expected to be
        assert isinstance(json.loads(o.text), dict), o.text
    choices = ["positive", "negative", "neutral"]
    sp = fdpp.SamplingParams(temperature=0, max_tokens=10, structured_outputs=StructuredOutputsParams(choice=choices))
    o = _chat(llm, "Sentiment of 'I love this movie'?", sp)
    assert o.text in choices and o.finish_reason == "stop"


def test_guided_regex_in_generate(llm):
    sp = fdpp.SamplingParams(temperature=0.7, seed=3, max_tokens=30,
                             structured_outputs=StructuredOutputsParams(regex=r"[0-9]{3}-[0-9]{4}"))
    outs = llm.generate(["My phone number is", "Call me at"], sp, use_tqdm=False)
    for out in outs:
        assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", out.outputs[0].text), out.outputs[0].text
        assert out.outputs[0].finish_reason == "stop"


def test_pydantic_model_as_schema(llm):
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=16)
        country: str = pydantic.Field(max_length=16)

    sp = fdpp.SamplingParams(temperature=0, max_tokens=80, structured_outputs=StructuredOutputsParams(json=City))
    o = _chat(llm, "Name a city and its country as JSON.", sp)
    City.model_validate_json(o.text)


@pytest.mark.parametrize("kwargs,words", [
    (dict(json={"type": "integer", "minimum": 3}), '"minimum"'),
    (dict(json={"type": "string", "format": "hostname"}), "hostname"),
    (dict(regex="(?=a)b"), "lookaround"),
    (dict(choice=[]), "choices is empty"),
    (dict(grammar="root ::= 'a'"), "grammar"),
    (dict(regex="a", choice=["a"]), "exactly one"),
])
def test_unsupported_is_refused_by_name(kwargs, words):
    with pytest.raises(fdpp.InvalidInputError, match=re.escape(words)):
        StructuredOutputsParams(**kwargs)


def test_sampling_params_fields():
    so = StructuredOutputsParams(choice=["a", "b"])
    sp = fdpp.SamplingParams(structured_outputs=so)
    assert sp.structured_outputs is so and sp.guided_decoding is so
    assert fdpp.SamplingParams(structured_outputs=StructuredOutputsParams(choice=["a", "b"])) == sp
    with pytest.raises(fdpp.InvalidInputError, match="not both"):
        fdpp.SamplingParams(structured_outputs=so, guided_decoding=so)


def test_min_tokens_with_structured_output_is_refused(llm):
    # The format decides where the output may end; min_tokens holding the end back could leave no
    # allowed token, so the pair is refused by name instead of failing mid-way.
    sp = fdpp.SamplingParams(temperature=0, max_tokens=10, min_tokens=3,
                             structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
    with pytest.raises(fdpp.InvalidInputError, match="min_tokens = 3 cannot be combined with structured output"):
        llm.generate("Is water wet?", sp, use_tqdm=False)
