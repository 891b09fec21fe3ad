"""SamplingParams checks its values against the engine's table of request limits
(src/engine/request_limits.h): the bad values of tests/fixtures/request_limits_bad_values.json, the
table tests/test_request_limits.cpp feeds to a prompts file's line, the server and the sampler, get
the same message here, word for word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fdpp

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "request_limits_bad_values.json"
TABLE = json.loads(FIXTURE.read_text())
CASES = [c for c in TABLE["cases"] if "python" in TABLE["spellings"][c["param"]]]


def _value(case):
    return float(case["float_value"]) if "float_value" in case else case["value"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['param']}={str(c.get('value', c.get('float_value')))[:20]}")
def test_bad_values_get_the_tables_message(case):
    name = TABLE["spellings"][case["param"]]["python"]
    with pytest.raises(fdpp.InvalidInputError) as e:
        fdpp.SamplingParams(**{name: _value(case)})
    assert str(e.value) == case["message"].replace("{name}", name)


def test_every_python_parameter_has_bad_values():
    taken = {p for p, s in TABLE["spellings"].items() if "python" in s}
    assert taken == {c["param"] for c in CASES}
    assert len(CASES) >= 30


def test_the_edges_are_allowed():
    # The bounds themselves, and the spellings of "off" and "random" that vLLM and llama.cpp use.
    p = fdpp.SamplingParams(temperature=100, top_k=-1, top_p=1, min_p=0, repetition_penalty=0.01,
                            repeat_last_n=-1, seed=(1 << 63) - 1, max_tokens=1 << 24, presence_penalty=0.0,
                            frequency_penalty=0, stop=["x" * 256] * 16, stop_token_ids=[0] * 64)
    assert p.top_k == -1 and p.temperature == 100.0 and isinstance(p.temperature, float)
    assert fdpp.SamplingParams(seed=-1).seed is None  # -1: a random seed per request, as None
    assert fdpp.SamplingParams(temperature=0).temperature == 0.0


def test_types_beyond_the_range_checks():
    # bool is an int subclass, but True is not a token count.
    with pytest.raises(fdpp.InvalidInputError, match='^"max_tokens" must be an integer, not True$'):
        fdpp.SamplingParams(max_tokens=True)
    with pytest.raises(fdpp.InvalidInputError, match=r"""^"temperature" must be a number, not 'hot'$"""):
        fdpp.SamplingParams(temperature="hot")
    with pytest.raises(fdpp.InvalidInputError, match=r'^"seed" 100000000000000000000000000000 must be in \[-1, '):
        fdpp.SamplingParams(seed=10**29)
    long = "x" * 1000
    with pytest.raises(fdpp.InvalidInputError) as e:
        fdpp.SamplingParams(top_p=long)
    assert len(str(e.value)) < 120 and str(e.value).endswith("...")
