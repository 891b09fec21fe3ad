"""fdpp: FlashDecoding++ LLM inference from Python, with vLLM's offline names.

    import fdpp
    llm = fdpp.LLM()                                   # the default model (SmolLM2-135M-Instruct)
    outs = llm.generate(["Once upon a time", "The capital of France is"],
                        fdpp.SamplingParams(temperature=0, max_tokens=32))   # a tqdm bar when installed
    for o in outs:
        print(o.prompt, "->", o.text, o.finish_reason)
    for piece in llm.stream("Tell me a story", fdpp.SamplingParams(max_tokens=64)):
        print(piece, end="", flush=True)
    logits = llm.logits([1, 2, 3])                     # numpy float32 [3, vocab]

Every prompt of one generate() call runs as one continuously batched job on fdpp's scheduler (the
same one the server uses). The GIL is released while the engine computes; Ctrl-C cancels the
requests, frees their KV cache and raises KeyboardInterrupt, and the LLM stays usable.

Errors: fdpp.FdppError is the base; fdpp.InvalidInputError (also a ValueError) is raised for bad
input (a missing or corrupt model, an argument out of range), and
fdpp.EngineError (also a RuntimeError) when the engine fails while computing. The message is the
one line the CLI prints after "fdpp: error: ". A prompt of generate() or chat() that does not fit
the context is the exception: it alone ends early (finish_reason "length", as in vLLM) or is
refused alone (finish_reason "error", the message in RequestOutput.error); the other prompts run.
"""

from __future__ import annotations

import json
import json as _json
import numbers
import operator
import os
import random
import secrets
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence, Union

if TYPE_CHECKING:
    import numpy as np

from . import _core
from ._core import EngineError, FdppError, InvalidInputError

__all__ = [
    "LLM",
    "SamplingParams",
    "StructuredOutputsParams",
    "GuidedDecodingParams",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
    "RequestMetrics",
    "Tokenizer",
    "BatchEncoding",
    "FdppError",
    "InvalidInputError",
    "EngineError",
    "default_model_path",
    "cuda_built",
]

__version__ = "0.1.0"

#: True when this build of fdpp has the CUDA backend compiled in.
cuda_built: bool = _core.cuda_built


def default_model_path() -> str:
    """The path LLM() loads without a model: $FDPP_MODEL, else SmolLM2-135M-Instruct.Q4_1.gguf in
    ${FDPP_CACHE:-~/.cache/fdpp}/models (scripts/fetch-default-model.sh puts it there)."""
    return _core.default_model_path()


def _bad(message: str) -> InvalidInputError:
    return InvalidInputError(message)


def _check_int(name: str, value: Any, low: int, high: Optional[int] = None) -> int:
    # bool is an int subclass; True as a token count is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{name}: expected an integer, got {type(value).__name__} {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise _bad(f"{name}: {value} is not {bounds}")
    return value


def _text(name: str, value: str) -> str:
    # A str can hold lone surrogates ("\ud800", from bad decoding upstream) that have no UTF-8:
    # named here, where the binding would raise a multi-line TypeError about its signature.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _bad(f"{name}: character {e.start} ({value[e.start]!r}) cannot be encoded as UTF-8") from None
    return value


def _check_param(name: str, value: Any) -> Any:
    # The table of request limits (src/engine/request_limits.h, through the extension): the ranges
    # and the messages of the CLI's prompts files, the server and the sampler.
    message = _core.request_param_problem(name, value)
    if message:
        raise _bad(message)
    return value


class StructuredOutputsParams:
    """Structured output, as vLLM's StructuredOutputsParams (and its older GuidedDecodingParams):
    give exactly one of

    Args:
        json: a JSON schema (a dict, its JSON text, or a pydantic model class); the output is JSON
            that the schema accepts (the README's "Structured output" lists the keywords; any other
            is refused naming it).
        regex: a regular expression the whole output matches.
        choice: a list of strings; the output is one of them.
        json_object: True: the output is a JSON object.

    grammar (EBNF), whitespace_pattern and structural_tag are not supported and refused; backend and
    the disable_* options of vLLM's backends are accepted and change nothing (one engine, strict).
    Compiled when made, so a schema fdpp cannot honour fails here (InvalidInputError).
    """

    __slots__ = ("json", "regex", "choice", "json_object", "_grammar")

    def __init__(self, json: Any = None, regex: Optional[str] = None, choice: Optional[Sequence[str]] = None,
                 json_object: Optional[bool] = None, grammar: Optional[str] = None,
                 whitespace_pattern: Optional[str] = None, structural_tag: Optional[str] = None,
                 backend: Optional[str] = None, disable_fallback: bool = False,
                 disable_any_whitespace: bool = False, disable_additional_properties: bool = False) -> None:
        for name, value in (("grammar", grammar), ("whitespace_pattern", whitespace_pattern),
                            ("structural_tag", structural_tag)):
            if value is not None:
                raise _bad(f"structured output: {name} is not supported (json, regex, choice or json_object)")
        given = [n for n, v in (("json", json), ("regex", regex), ("choice", choice), ("json_object", json_object))
                 if v is not None and v is not False]
        if len(given) != 1:
            raise _bad("structured output: give exactly one of json, regex, choice or json_object"
                       + (f" (got {', '.join(given)})" if given else ""))
        self.json, self.regex, self.choice, self.json_object = json, regex, choice, json_object
        if json is not None:
            if hasattr(json, "model_json_schema"):  # a pydantic model class
                json = json.model_json_schema()
            text = json if isinstance(json, str) else _json.dumps(json)
            self._grammar = _core.compile_grammar("json", text)
        elif regex is not None:
            if not isinstance(regex, str):
                raise _bad(f"structured output: regex must be a str, got {type(regex).__name__}")
            self._grammar = _core.compile_grammar("regex", regex)
        elif choice is not None:
            if isinstance(choice, str) or not all(isinstance(c, str) for c in choice):
                raise _bad("structured output: choice must be a list of strings")
            self._grammar = _core.compile_grammar("choice", choices=list(choice))
        else:
            if json_object is not True:
                raise _bad("structured output: json_object must be True")
            self._grammar = _core.compile_grammar("json_object")

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__ if not k.startswith("_")
                           and getattr(self, k) is not None)
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StructuredOutputsParams):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in ("json", "regex", "choice", "json_object"))


class GuidedDecodingParams(StructuredOutputsParams):
    """vLLM's older name (SamplingParams(guided_decoding=...)); the same fields."""

    __slots__ = ()


class SamplingParams:
    """How to sample: checked when made, so a bad value fails here, not in the middle of a batch.

    Defaults follow vLLM's: temperature 1.0 with every filter off (top_k 0, top_p 1, min_p 0,
    repetition_penalty 1) and max_tokens 16, so that code written for vLLM samples the same
    distribution. fdpp's CLI keeps llama.cpp's (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05).
    The filters run in vLLM's order: logit_bias and min_tokens, repetition penalty, presence and
    frequency penalties, temperature, top-k, top-p, min-p.

    Args:
        temperature: in [0, 100]; 0 = greedy (argmax).
        top_k: keep the k most likely tokens, in [-1, 2^24]; 0 or -1 = off (-1 is vLLM's spelling).
        top_p: nucleus mass in (0, 1]; 1 = off.
        min_p: drop tokens below min_p x the top probability, in [0, 1]; 0 = off.
        repetition_penalty: in [0.01, 100]; 1 = off (llama.cpp's --repeat-penalty).
        repeat_last_n: how many recent tokens the penalty sees, in [-1, 2^30]; -1 (the default) =
            all of them, prompt included, as vLLM's penalty does (the CLI's default window is 64).
        seed: the request's random stream, in [0, 2^63); None or -1 = the LLM's seed stream
            (LLM(seed=...)), else a fresh random seed per request (as vLLM). With a seed, the tokens
            depend only on the seed and the logits, never on the batch.
        max_tokens: tokens to generate, in [1, 2^24] (default 16, as vLLM's); None = up to the end of
            the context (max_model_len less the prompt), as vLLM's None. A prompt whose prompt +
            max_tokens exceed the context generates what fits and ends with finish_reason "length".
        stop: a string or up to 16 strings of 1 to 256 bytes; the text ends before the first one found
            (finish_reason "stop").
        stop_token_ids: ids that end the generation as an end-of-generation token does (vLLM's): kept
            in token_ids, not in the text; ignore_eos does not turn them off. At most 64.
        ignore_eos: keep generating past end-of-generation tokens.
        n: completions per prompt, in [1, 64]: RequestOutput.outputs holds n of them. They run as n
            requests side by side; completion j > 0 draws from a seed derived from seed (or a fresh
            one when seed is None), so the completions differ when temperature > 0.
        best_of: None or n (vLLM's; fdpp keeps every completion it samples).
        presence_penalty, frequency_penalty: OpenAI's, in [-2, 2] (0 = off), over the generated
            tokens: a token's logit loses presence_penalty once if it was generated and
            frequency_penalty for each time.
        min_tokens: in [0, max_tokens]: the end-of-generation ids and stop_token_ids are held back
            (and stop strings not looked for) until this many tokens are generated.
        logit_bias: {token id: bias in [-100, 100]} added to the logits (at most 300 entries).
        logprobs: None, or k in [0, 20]: each CompletionOutput gets logprobs (per generated token a
            dict {id: Logprob} of the k most likely tokens and the sampled one) and
            cumulative_logprob. They are of the model's own distribution (log-softmax of the raw
            logits, before logit_bias, the penalties and the temperature: vLLM's default), so at
            temperature 0 without bias or penalties the sampled token is the top one.

        prompt_logprobs: None, or k in [0, 20]: RequestOutput.prompt_logprobs gets, per prompt token,
            None for the first and a dict {id: Logprob} of the k most likely tokens and the prompt's
            own for every other (vLLM's shape). The prompt is then computed whole, not taken from
            the prefix cache.

    vLLM's fields that fdpp does not implement are accepted at the value that leaves the output as
    it is, so that code written for vLLM runs unchanged, and refused otherwise (InvalidInputError
    naming the field): skip_special_tokens (True).

    The ranges and the messages of a value out of them are those of the server and of the CLI's
    prompts files: one table in the engine (src/engine/request_limits.h), e.g.
    '"top_p" 0 must be in (0, 1] (1 = off)'.
    """

    __slots__ = (
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repetition_penalty",
        "repeat_last_n",
        "seed",
        "max_tokens",
        "stop",
        "ignore_eos",
        "stop_token_ids",
        "n",
        "best_of",
        "presence_penalty",
        "frequency_penalty",
        "min_tokens",
        "logit_bias",
        "logprobs",
        "prompt_logprobs",
        "structured_outputs",
    )

    def __init__(
        self,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        seed: Optional[int] = None,
        max_tokens: Optional[int] = 16,
        stop: Union[str, Sequence[str], None] = None,
        ignore_eos: bool = False,
        repeat_last_n: int = -1,
        *,
        n: int = 1,
        best_of: Optional[int] = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logprobs: Optional[int] = None,
        prompt_logprobs: Optional[int] = None,
        stop_token_ids: Optional[Sequence[int]] = None,
        skip_special_tokens: bool = True,
        min_tokens: int = 0,
        logit_bias: Optional[dict[int, float]] = None,
        structured_outputs: Optional[StructuredOutputsParams] = None,
        guided_decoding: Optional[StructuredOutputsParams] = None,
    ) -> None:
        if structured_outputs is not None and guided_decoding is not None:
            raise _bad("give structured_outputs or guided_decoding (vLLM's older name), not both")
        so = structured_outputs if structured_outputs is not None else guided_decoding
        if so is not None and not isinstance(so, StructuredOutputsParams):
            raise _bad(f"structured_outputs: expected StructuredOutputsParams, got {type(so).__name__}")
        self.structured_outputs = so
        for name, value, neutral in (("skip_special_tokens", skip_special_tokens, (True,)),):
            # bool is an int: True must not pass as n = 1, nor False as a penalty of 0.
            if isinstance(value, bool) != isinstance(neutral[-1], bool) or value not in neutral:
                raise _bad(f"{name}: {value!r} is not supported (fdpp takes only {' or '.join(map(repr, neutral))})")
        if stop_token_ids is None:
            stop_token_ids = []
        elif isinstance(stop_token_ids, (str, bytes)) or not isinstance(stop_token_ids, Iterable):
            raise _bad(f"stop_token_ids: expected a list of token ids, got {type(stop_token_ids).__name__}")
        self.stop_token_ids = []
        for i, t in enumerate(stop_token_ids):
            name = f"stop_token_ids[{i}]"
            self.stop_token_ids.append(_check_int(name, _token_id(name, t), 0, (1 << 31) - 1))
        if message := _core.request_list_problem("stop_token_ids", len(self.stop_token_ids)):
            raise _bad(message)
        self.n = _check_param("n", n)
        if best_of is not None and _check_param("best_of", best_of) != n:
            raise _bad(f"best_of: {best_of!r} with n = {n} is not supported (fdpp keeps every completion it "
                       f"samples: best_of must be None or n)")
        self.best_of = best_of
        self.presence_penalty = float(_check_param("presence_penalty", presence_penalty))
        self.frequency_penalty = float(_check_param("frequency_penalty", frequency_penalty))
        self.logprobs = None if logprobs is None else _check_param("logprobs", logprobs)
        self.prompt_logprobs = None if prompt_logprobs is None else _check_param("prompt_logprobs", prompt_logprobs)
        self.min_tokens = _check_param("min_tokens", min_tokens)
        bias = {} if logit_bias is None else logit_bias
        if not isinstance(bias, dict):
            raise _bad(f"logit_bias: expected a dict of token id -> bias, got {type(bias).__name__}")
        if message := _core.request_list_problem("logit_bias", len(bias)):
            raise _bad(message)
        self.logit_bias = {}
        for t, b in bias.items():
            # vLLM's keys are ints; OpenAI's JSON sends them as strings of digits.
            tid = int(t) if isinstance(t, str) and t.isdigit() else _token_id("logit_bias key", t)
            _check_int(f"logit_bias[{tid}]", tid, 0, (1 << 31) - 1)
            if isinstance(b, bool) or not isinstance(b, numbers.Real):
                raise _bad(f"logit_bias[{tid}]: expected a number, got {type(b).__name__} {b!r}")
            if message := _core.request_param_problem("logit_bias_value", float(b)):
                raise _bad(message.replace('"logit_bias_value"', f'"logit_bias[{tid}]"', 1))
            self.logit_bias[tid] = float(b)
        self.temperature = float(_check_param("temperature", temperature))
        self.top_k = _check_param("top_k", top_k)
        self.top_p = float(_check_param("top_p", top_p))
        self.min_p = float(_check_param("min_p", min_p))
        self.repetition_penalty = float(_check_param("repetition_penalty", repetition_penalty))
        self.repeat_last_n = _check_param("repeat_last_n", repeat_last_n)
        # -1: a random seed, as None (vLLM's and llama.cpp's spelling).
        self.seed = None if seed is None or _check_param("seed", seed) == -1 else seed
        self.max_tokens = None if max_tokens is None else _check_param("max_tokens", max_tokens)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise _bad(f"min_tokens: {self.min_tokens} exceeds max_tokens = {self.max_tokens}")
        if stop is None:
            stops: list[str] = []
        elif isinstance(stop, str):
            stops = [stop]
        elif isinstance(stop, (list, tuple)):
            stops = list(stop)
        else:
            raise _bad(f"stop: expected a str or a list of str, got {type(stop).__name__}")
        if message := _core.request_list_problem("stop", len(stops)):
            raise _bad(message)
        for i, s in enumerate(stops):
            if not isinstance(s, str):
                raise _bad(f"stop: {s!r} is not a string")
            _text(f"stop[{i}]", s)
            if message := _core.stop_string_problem(s):
                raise _bad(message)
        self.stop = stops
        if not isinstance(ignore_eos, bool):
            raise _bad(f"ignore_eos: expected a bool, got {type(ignore_eos).__name__}")
        self.ignore_eos = ignore_eos

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"SamplingParams({fields})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SamplingParams):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    def _request(self, prompt_ids: list[int], max_model_len: int,
                 seeds: Optional[random.Random] = None) -> "_core.CoreRequest":
        """The engine's request. max_tokens beyond the context is cut to what fits, so the request
        ends with "length" there, as vLLM's does; LLM._run refuses a prompt that leaves no room."""
        s = _core.CoreSampling()
        s.temperature = self.temperature
        s.top_k = max(self.top_k, 0)
        s.top_p = self.top_p
        s.min_p = self.min_p
        s.repeat_penalty = self.repetition_penalty
        s.repeat_last_n = self.repeat_last_n
        if self.seed is not None:
            s.seed = self.seed
        else:
            s.seed = seeds.getrandbits(63) if seeds is not None else secrets.randbits(64)
        r = _core.CoreRequest()
        r.prompt = prompt_ids
        r.sampling = s
        # None: the rest of the context. A prompt that leaves no room is refused before this (LLM._run);
        # stream() has no other prompts to keep running, so there the scheduler's message stands.
        room = max(max_model_len - len(prompt_ids), 1)
        r.max_tokens = room if self.max_tokens is None else min(self.max_tokens, room)
        r.ignore_eos = self.ignore_eos
        r.stop_token_ids = self.stop_token_ids
        r.stop = self.stop
        s.presence_penalty = self.presence_penalty
        s.frequency_penalty = self.frequency_penalty
        s.min_tokens = min(self.min_tokens, r.max_tokens)
        s.logit_bias = list(self.logit_bias.items())
        s.logprobs = -1 if self.logprobs is None else self.logprobs
        r.sampling = s
        r.prompt_logprobs = -1 if self.prompt_logprobs is None else self.prompt_logprobs
        if self.structured_outputs is not None:
            r.set_grammar(self.structured_outputs._grammar)
        return r

    def _requests(self, prompt_ids: list[int], max_model_len: int,
                  seeds: Optional[random.Random] = None) -> "list[_core.CoreRequest]":
        """n requests: completion j > 0 draws from _core.derived_seed(seed, j) (fdpp serve's rule)
        or, without a seed, from a fresh one. Only the first scores the prompt (prompt_logprobs):
        the output takes the scores from it, and the others may reuse its cached prefix."""
        first = self._request(prompt_ids, max_model_len, seeds)
        out = [first]
        for j in range(1, self.n):
            r = self._request(prompt_ids, max_model_len, seeds)
            r.prompt_logprobs = -1
            if self.seed is not None:
                s = r.sampling
                s.seed = _core.derived_seed(self.seed, j)
                r.sampling = s
            out.append(r)
        return out

    @property
    def guided_decoding(self) -> Optional[StructuredOutputsParams]:
        """vLLM's older name of structured_outputs."""
        return self.structured_outputs


@dataclass
class RequestMetrics:
    """Seconds measured by the scheduler from the request's submission."""

    time_to_first_token: float
    total_time: float
    #: decode time per generated token after the first (0 with fewer than two tokens)
    time_per_output_token: float
    #: times the request was preempted (its KV cache dropped and recomputed later)
    preemptions: int


@dataclass
class CompletionOutput:
    """One completion of a request (vLLM's shape: fdpp makes one per request)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str
    #: why a refused request did not run (finish_reason "error"); None otherwise
    error: Optional[str] = None
    #: what ended a "stop", as vLLM's: the stop token id or the stop string; None for an
    #: end-of-generation token and for every other finish
    stop_reason: Union[int, str, None] = None
    #: SamplingParams.logprobs = k: per generated token {id: Logprob} of the k most likely tokens
    #: and the sampled one (vLLM's shape); None otherwise
    logprobs: Optional[list[dict[int, "Logprob"]]] = None
    #: the sum of the sampled tokens' logprobs when logprobs were asked; None otherwise
    cumulative_logprob: Optional[float] = None


@dataclass
class Logprob:
    """vLLM's Logprob: a token's log probability under the model (raw logits' log-softmax), its
    rank among the vocabulary (1 = the most likely) and its text."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


@dataclass
class RequestOutput:
    """The result of one prompt: vLLM's RequestOutput with the completion's fields on top.

    finish_reason: "stop" (an end-of-generation token or a stop string), "length" (max_tokens or
    the context), "cancelled", or "error" for a prompt refused alone because it leaves no room in
    the context for a token (`error` says so; the batch's other prompts run).
    """

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str
    metrics: RequestMetrics
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True
    error: Optional[str] = None
    #: prompt tokens taken from the prefix cache instead of computed (vLLM's num_cached_tokens)
    num_cached_tokens: Optional[int] = None
    #: SamplingParams.prompt_logprobs = k: None for the first prompt token, then per token {id:
    #: Logprob} of the k most likely and the prompt's own (vLLM's shape); None when not asked
    prompt_logprobs: Optional[list[Optional[dict[int, "Logprob"]]]] = None


def _refused(prompt: Optional[str], ids: list[int], message: str) -> RequestOutput:
    return RequestOutput(
        request_id="", prompt=prompt, prompt_token_ids=ids, text="", token_ids=[], finish_reason="error",
        metrics=RequestMetrics(0.0, 0.0, 0.0, 0), outputs=[CompletionOutput(0, "", [], "error", message)],
        error=message,
    )


def _logprob_dicts(tokens, lps, token_text: Optional[Callable[[int], str]]) -> list[dict[int, "Logprob"]]:
    """Per token, {id: Logprob} of the top alternatives and the token itself (vLLM's shape)."""
    out = []
    for tok, (lp, rank, top) in zip(tokens, lps):
        entry = {tid: Logprob(v, i + 1, token_text(tid) if token_text else None) for i, (tid, v) in enumerate(top)}
        if tok not in entry:
            entry[tok] = Logprob(lp, rank, token_text(tok) if token_text else None)
        out.append(entry)
    return out


def _completion(index: int, r: "_core.CoreResult", token_text: Optional[Callable[[int], str]],
                want_logprobs: bool) -> CompletionOutput:
    logprobs = None
    cumulative = None
    if want_logprobs:
        logprobs = _logprob_dicts(r.token_ids, r.logprobs, token_text)
        cumulative = r.cumulative_logprob
    return CompletionOutput(index, r.text, list(r.token_ids), r.finish_reason, stop_reason=r.stop_reason,
                            logprobs=logprobs, cumulative_logprob=cumulative)


def _output(rs: "list[_core.CoreResult]", prompt: Optional[str],
            token_text: Optional[Callable[[int], str]] = None, want_logprobs: bool = False,
            want_prompt_logprobs: bool = False) -> RequestOutput:
    for r in rs:
        if r.finish_reason == "error":
            raise EngineError(r.error)
    r = rs[0]
    outputs = [_completion(j, x, token_text, want_logprobs) for j, x in enumerate(rs)]
    prompt_logprobs = None
    if want_prompt_logprobs:
        prompt_logprobs = [None] + _logprob_dicts(list(r.prompt)[1:], r.prompt_logprobs, token_text)
    return RequestOutput(
        request_id=str(r.id),
        prompt=prompt,
        prompt_token_ids=list(r.prompt),
        text=outputs[0].text,
        token_ids=outputs[0].token_ids,
        finish_reason=r.finish_reason,
        metrics=RequestMetrics(r.time_to_first_token, r.total_time, r.time_per_output_token, r.preemptions),
        outputs=outputs,
        num_cached_tokens=r.cached_tokens,
        prompt_logprobs=prompt_logprobs,
    )


def _one_id(x: Any) -> bool:
    # One id rather than a sequence of them: an int or a numpy integer (numbers.Integral), never a
    # bool; a numpy array has __index__ too, so that test would not tell them apart.
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


class BatchEncoding(dict):
    """What a tokenizer call returns, as HF's: a dict of "input_ids" and "attention_mask" whose keys
    read as attributes too (enc.input_ids)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class Tokenizer:
    """The model's tokenizer (llm.get_tokenizer()), with the common surface of HF's tokenizers:
    tok(text), encode, decode, batch_decode, apply_chat_template, convert_ids_to_tokens, len(tok),
    vocab_size, eos_token(_id), bos_token(_id). Defaults are HF's where HF has the method
    (decode keeps special tokens; apply_chat_template tokenizes without a generation prompt)."""

    def __init__(self, core: "_core.CoreTokenizer") -> None:
        self._t = core

    def encode(self, text: str, add_special_tokens: bool = True, parse_special: bool = True) -> list[int]:
        """Text to ids. add_special_tokens: prepend BOS where the model does by default (as the
        CLI's prompts do); parse_special: text like "<|im_start|>" becomes the special token."""
        if not isinstance(text, str):
            raise _bad(f"encode: expected a str, got {type(text).__name__}")
        return self._t.encode(_text("encode", text), None if add_special_tokens else False, parse_special)

    def __call__(self, text: Union[str, Sequence[str]], add_special_tokens: bool = True) -> BatchEncoding:
        """HF's tok(text) or tok([text, ...]): {"input_ids": ids, "attention_mask": ones}, a list
        of each for a list of texts. No padding, truncation or tensors: fdpp batches by itself."""
        if isinstance(text, str):
            ids = self.encode(text, add_special_tokens)
            return BatchEncoding(input_ids=ids, attention_mask=[1] * len(ids))
        if isinstance(text, (bytes, bytearray, dict)) or not isinstance(text, Iterable):
            raise _bad(f"text: expected a str or a list of str, got {type(text).__name__}")
        batch = [self.encode(t, add_special_tokens) for t in text]
        return BatchEncoding(input_ids=batch, attention_mask=[[1] * len(ids) for ids in batch])

    def decode(self, token_ids: Union[int, Sequence[int]], skip_special_tokens: bool = False) -> str:
        """Ids (or one id) to text, special tokens kept unless skip_special_tokens (HF's default;
        generate()'s text skips them, as vLLM's). Bytes that are not valid UTF-8 become U+FFFD."""
        if _one_id(token_ids):
            token_ids = [token_ids]
        return self._t.decode(_ids("token_ids", token_ids), skip_special_tokens)

    def batch_decode(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = False) -> list[str]:
        """decode() of each sequence."""
        if isinstance(sequences, (str, bytes, bytearray, dict)) or not isinstance(sequences, Iterable):
            raise _bad(f"sequences: expected a list of token id lists, got {type(sequences).__name__}")
        return [self.decode(ids, skip_special_tokens) for ids in sequences]

    def apply_chat_template(self, messages: Sequence[dict], tokenize: bool = True,
                            add_generation_prompt: bool = False, tools: Optional[Sequence[dict]] = None,
                            **template_kwargs: Any) -> Union[str, list[int]]:
        """Renders [{"role": ..., "content": ...}, ...] with the model's chat template; the ids of
        that text with tokenize=True (HF's default; no BOS added beyond what the template writes),
        the text with tokenize=False. add_generation_prompt ends with the assistant's header.
        tools: OpenAI's tool definitions ({"type": "function", "function": {...}}), written as the
        template writes them (LLM.chat's tools). template_kwargs: the template's variables, as HF
        passes them (enable_thinking=False: Qwen3's empty think block). LLM.chat renders with the
        generation prompt, as the CLI's --chat does."""
        if not isinstance(tokenize, bool) or not isinstance(add_generation_prompt, bool):
            raise _bad("apply_chat_template: tokenize and add_generation_prompt must be True or False")
        thinking = _enable_thinking("apply_chat_template", template_kwargs)
        text = self._t.apply_chat_template(_messages(messages), add_generation_prompt, thinking,
                                           _tools("apply_chat_template", tools))
        return self._t.encode(text, False, True) if tokenize else text

    @property
    def tool_call_format(self) -> str:
        """How the chat template has the model write a tool call: "hermes" (<tool_call> tags:
        Qwen, and fdpp's generic format for templates without tool syntax), "llama3_json" or
        "mistral" (the names of vLLM's tool parsers)."""
        return self._t.tool_call_format

    def convert_ids_to_tokens(self, ids: Union[int, Sequence[int]],
                              skip_special_tokens: bool = False) -> Union[str, list[str]]:
        """The vocabulary spelling of an id, or of each id of a list (HF's)."""
        if _one_id(ids):
            return self.id_to_token(ids)
        return [self._t.id_to_token(i) for i in _ids("ids", ids)
                if not (skip_special_tokens and self._t.is_special(i))]

    def convert_tokens_to_ids(self, tokens: Union[str, Sequence[str]]) -> Union[Optional[int], list[Optional[int]]]:
        """The id of a vocabulary spelling (None when there is none), or of each of a list."""
        if isinstance(tokens, str):
            return self.token_to_id(tokens)
        return [self.token_to_id(t) for t in tokens]

    def token_to_id(self, token: str) -> Optional[int]:
        """The id of a token by its vocabulary spelling, or None."""
        return self._t.token_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary spelling of an id."""
        return self._t.id_to_token(_token_id("token_id", token_id))

    def __len__(self) -> int:
        """The whole vocabulary, special tokens included (HF's len(tokenizer))."""
        return self._t.vocab_size

    @property
    def vocab_size(self) -> int:
        return self._t.vocab_size

    @property
    def bos_token_id(self) -> Optional[int]:
        return self._t.bos_token_id

    @property
    def eos_token_id(self) -> Optional[int]:
        return self._t.eos_token_id

    @property
    def bos_token(self) -> Optional[str]:
        """The BOS token's spelling ("<s>"), or None when the model has none."""
        i = self._t.bos_token_id
        return None if i is None else self._t.id_to_token(i)

    @property
    def eos_token(self) -> Optional[str]:
        """The EOS token's spelling ("<|im_end|>"), or None when the model has none."""
        i = self._t.eos_token_id
        return None if i is None else self._t.id_to_token(i)


def _token_id(name: str, x: Any) -> int:
    # An int or anything that is one exactly (numpy's integers: __index__); never a float, which
    # int() would truncate into a different token, nor a bool.
    if isinstance(x, bool) or not hasattr(type(x), "__index__"):
        raise _bad(f"{name}: expected a token id (an integer), got {type(x).__name__} {x!r}")
    v = operator.index(x)
    # Beyond int32 the binding could not take it; within, the engine names the vocabulary's range.
    if not -(1 << 31) <= v < (1 << 31):
        raise _bad(f"{name}: token id {v} is out of range")
    return v


def _ids(name: str, ids: Any) -> list[int]:
    if isinstance(ids, (str, bytes, bytearray, dict)) or not isinstance(ids, Iterable):
        raise _bad(f"{name}: expected a sequence of token ids, got {type(ids).__name__}")
    return [_token_id(f"{name}[{k}]", x) for k, x in enumerate(ids)]


def _messages(messages: Any) -> list[tuple[str, str, str, list[tuple[str, str, str]]]]:
    """Messages as the engine takes them: (role, content, tool_call_id, [(id, name, arguments)]).
    OpenAI's shapes: an assistant message may have tool_calls (and content None), a "tool" message
    a tool_call_id; arguments are JSON text or a dict."""
    if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, Iterable):
        raise _bad(f"messages: expected a list of {{'role', 'content'}} dicts, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        try:
            role = m["role"]
            content = m["content"] if "content" in m or not m.get("tool_calls") else None
        except (TypeError, KeyError, AttributeError):
            raise _bad(f"messages[{i}]: expected a dict with 'role' and 'content'") from None
        calls = m.get("tool_calls") or []
        if content is None and calls:
            content = ""
        if not isinstance(role, str) or not isinstance(content, str):
            raise _bad(f"messages[{i}]: 'role' and 'content' must be strings")
        call_id = m.get("tool_call_id") or ""
        if not isinstance(call_id, str):
            raise _bad(f"messages[{i}].tool_call_id must be a string")
        out.append((_text(f"messages[{i}].role", role), _text(f"messages[{i}].content", content), call_id,
                    [_tool_call(f"messages[{i}].tool_calls[{k}]", c) for k, c in enumerate(calls)]))
    if not out:
        raise _bad("messages: the conversation is empty")
    return out


def _tool_call(where: str, call: Any) -> tuple[str, str, str]:
    f = call.get("function") if isinstance(call, dict) else None
    if not isinstance(f, dict) or not isinstance(f.get("name"), str):
        raise _bad(f"{where}: expected {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}")
    args = f.get("arguments", "{}")
    if isinstance(args, dict):
        args = _json.dumps(args, ensure_ascii=False)
    if not isinstance(args, str):
        raise _bad(f"{where}.function.arguments must be JSON text or a dict")
    call_id = call.get("id") or ""
    if not isinstance(call_id, str):
        raise _bad(f"{where}.id must be a string")
    return call_id, f["name"], args


def _tools(where: str, tools: Any) -> list[str]:
    """OpenAI's tool definitions as JSON texts, in each dict's key order (the template prints it)."""
    if tools is None:
        return []
    if isinstance(tools, (str, bytes, dict)) or not isinstance(tools, Iterable):
        raise _bad(f"{where}: tools must be a list of {{'type': 'function', 'function': {{...}}}} dicts")
    out = []
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or t.get("type", "function") != "function":
            raise _bad(f"{where}: tools[{i}] must be {{'type': 'function', 'function': {{'name', ...}}}}")
        try:
            out.append(_json.dumps(t, ensure_ascii=False))
        except (TypeError, ValueError) as e:
            raise _bad(f"{where}: tools[{i}] is not JSON: {e}") from None
    return out


def _call_id(mistral: bool) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    if mistral:
        return "".join(secrets.choice(alphabet) for _ in range(9))
    return "call_" + "".join(secrets.choice(alphabet) for _ in range(24))


def _enable_thinking(where: str, kwargs: dict) -> Optional[bool]:
    """The chat template variables fdpp's native templates read: enable_thinking (Qwen3) only."""
    thinking = kwargs.pop("enable_thinking", None)
    if kwargs:
        raise _bad(f"{where}: {', '.join(sorted(map(str, kwargs)))} not supported (supported: enable_thinking)")
    if thinking is not None and not isinstance(thinking, bool):
        raise _bad(f"{where}: enable_thinking must be True, False or None")
    return thinking


PromptType = Union[str, Sequence[int]]

# vLLM's engine keywords that have no meaning in fdpp (yet): LLM(...) accepts them with one warning
# naming them, so that vLLM code runs; any other unknown keyword is a TypeError, as a typo should be.
_VLLM_IGNORED = frozenset({
    "swap_space", "cpu_offload_gb", "block_size",
    "max_seq_len_to_capture", "disable_custom_all_reduce", "disable_log_stats", "disable_log_requests",
    "tokenizer_mode", "skip_tokenizer_init", "revision", "tokenizer_revision", "code_revision",
    "download_dir", "hf_token", "hf_overrides", "max_logprobs", "enable_chunked_prefill",
    "pipeline_parallel_size", "data_parallel_size", "distributed_executor_backend", "enable_lora",
    "max_lora_rank", "max_loras", "max_cpu_loras", "limit_mm_per_prompt", "mm_processor_kwargs",
    "compilation_config", "num_gpu_blocks_override", "served_model_name", "speculative_config",
    "override_generation_config", "allowed_local_media_path", "task", "runner",
    "disable_async_output_proc", "enable_sleep_mode", "calculate_kv_scales", "worker_cls",
    "config_format", "rope_scaling", "rope_theta", "guided_decoding_backend", "model_impl",
    "async_scheduling", "enable_expert_parallel", "max_parallel_loading_workers",
    "use_v2_block_manager", "preemption_mode", "scheduling_policy",
    "kv_transfer_config", "max_num_partial_prefills", "long_prefill_token_threshold",
})


class _BarUpdate:
    # The engine reports how many of the job's requests have finished; a bar takes increments.
    def __init__(self, bar: Any) -> None:
        self.bar, self.shown = bar, 0

    def __call__(self, finished: int) -> None:
        self.bar.update(finished - self.shown)
        self.shown = finished


# generation_config.json's sampling fields that vLLM applies as defaults, and their SamplingParams names.
_GENERATION_FIELDS = (("temperature", "temperature"), ("top_k", "top_k"), ("top_p", "top_p"), ("min_p", "min_p"),
                      ("repetition_penalty", "repetition_penalty"), ("max_new_tokens", "max_tokens"))


def _progress_bar(use_tqdm: Union[bool, Callable[..., Any]], total: int) -> Any:
    # vLLM's use_tqdm: True shows tqdm's bar over the requests, a callable is the bar's class. tqdm
    # is not a dependency: without it there is no bar and no complaint.
    if use_tqdm is False or use_tqdm is None or total == 0:
        return None
    bar_class = use_tqdm if callable(use_tqdm) else None
    if bar_class is None:
        try:
            from tqdm.auto import tqdm as bar_class
        except ImportError:
            return None
    return bar_class(total=total, desc="Processed prompts", dynamic_ncols=True)



class LLM:
    """A model loaded for generation, chat, streaming and logits.

    The keywords under Args are options of fdpp's engine table, the same as the CLI's flag of that
    name (`fdpp serve --help` lists them with their ranges); None keeps its default. Those under
    "vLLM's keywords" are read here, except gpu_memory_utilization and enforce_eager (the table's).

    Args:
        model: a GGUF file or a Hugging Face model directory; None = the default model
            (fdpp.default_model_path()).
        device: "auto" (CUDA when a GPU is present and fdpp was built with CUDA), "cpu" or "cuda".
        dtype: the GPU's 16-bit type: "auto" (bf16 for bf16 checkpoints, else f16), "float16",
            "bfloat16" (or "f16", "bf16"). The CPU computes in fp32.
        kv_cache_tokens: KV cache size in tokens; None = sized by the engine (CUDA: from free memory).
        tensor_parallel: GPUs of this host to split the model over (Megatron-style, NCCL; CUDA only).
            vLLM's spelling tensor_parallel_size is accepted too.
        max_num_seqs: sequences decoded together in one step (default: as many as the KV cache
            holds with room for their outputs, at most 512 on the GPU and 64 on the CPU).
        max_num_batched_tokens: tokens of one step (decode rows and prefill chunks together;
            default: 8192 on the GPU, 2048 on the CPU).
        step_log: a file that gets one JSON line per scheduler step (rows, tokens, host and engine
            times; bench/step_timeline.py summarizes it).
        max_model_len: the context per sequence; None = the model's.
        attention: CUDA decode attention, "async" (FlashDecoding++'s unified max) or "sync".
        linear: CUDA linear layers: None ($FDPP_LINEAR, else "auto"), "auto", "gemv", "flat", "cublas".
        cuda_graphs: replay the decode step as a CUDA graph (default True).
        threads: CPU backend threads; None = $OMP_NUM_THREADS when set, else the physical cores.
        calibration: the unified-max calibration file (fdpp calibrate); None = looked up beside
            the model, then in fdpp's cache.
        cpu_weights: on the CPU, "stored" multiplies GGUF weights in their stored format (8-bit
            activations, as llama.cpp; the CLI's default) and "f32" dequantizes them to the exact
            fp32 reference.
        gpu_weights: on the GPU, "stored" keeps a GGUF file's layer matrices in their blocks (the
            default) and "dequantized" converts them to `dtype` at load (faster prefill and large
            batches for now).
        load_format: "auto" reads the model; "dummy" makes random weights of `config`'s shapes on
            the GPU, for measuring without a checkpoint (as `fdpp bench --load-format dummy`).
        config: the config.json of load_format="dummy" (configs/ has Llama-2-7B, Llama-3-8B, ...).
        pdl, decode_path: CUDA kernel switches ("on"/"off"; "auto", "mma", "core"), as the CLI's.
        prefill_attention: CUDA prefill attention's tile configuration: "auto" (the default) or one
            by name, as the CLI's --prefill-attention.

    vLLM's keywords:
        gpu_memory_utilization: on the GPU, the share in (0, 1] of the memory left free by the
            weights that the KV cache takes when kv_cache_tokens does not size it (default 0.9;
            vLLM's counts the weights in, fdpp's does not). No effect on the CPU.
        enforce_eager: True = cuda_graphs=False.
        seed: the seed stream of requests without a seed of their own: with it, a script's sampled
            outputs repeat from run to run; None = a fresh random seed per request.
        tokenizer: None, or the model's own path or folder (fdpp reads the tokenizer from the
            model); anything else is refused.
        trust_remote_code: accepted; fdpp never runs code from a model folder.
        quantization: None (the weights as stored: GGUF blocks, 16-bit checkpoints, FP8, AWQ and
            GPTQ checkpoints), "fp8" (CUDA: the layers' weights quantized to e4m3 at load, a scale
            per output row, as `--quantization fp8`) or "int4" (CUDA: 4 bits in groups of 128, as
            `--quantization int4`); a checkpoint published in FP8, AWQ or GPTQ runs as stored
            either way, and dequantized on the CPU. "awq", "gptq" and "gguf" (also "awq_marlin",
            "gptq_marlin") name the checkpoint's own method, as vLLM takes them: a model of another
            method is refused. Other methods are refused.
        generation_config: "auto" (the default, as vLLM's): the sampling defaults of the model
            folder's generation_config.json become get_default_sampling_params(), used when a call
            has no SamplingParams; "vllm" or None: vLLM's defaults only; a folder: its file.
        enable_prefix_caching: automatic prefix caching, on by default (None or True): a prompt's
            beginning that an earlier request computed is taken from the KV cache (whole blocks of
            16 tokens; the logits are the same); False computes every prompt from its first token.
            RequestOutput.num_cached_tokens says how many prompt tokens came from the cache.
        async_scheduling: on the GPU each step is scheduled and launched while the previous one
            computes (None or True, the default); False waits for its tokens first. The outputs
            are the same either way.
        kv_cache_dtype: "auto" (the default: fp32 on the CPU, the model's 16-bit dtype on the GPU),
            "f32" or "f16" (the CPU's; half the cache memory), or "fp8" (also "fp8_e4m3"; the GPU's:
            e4m3 with the checkpoint's per-layer k/v scales, else 1 as vLLM's uncalibrated fp8,
            twice the tokens in the same memory; the CPU refuses it). "fp8_e5m2" is refused.
        swap_space and vLLM's other engine keywords: accepted with one warning naming them; they
            change nothing here.
    """

    def __init__(
        self,
        model: Optional[Union[str, os.PathLike]] = None,
        device: Optional[str] = None,
        dtype: Optional[str] = None,
        kv_cache_tokens: Optional[int] = None,
        tensor_parallel: Optional[int] = None,
        max_num_seqs: Optional[int] = None,
        max_num_batched_tokens: Optional[int] = None,
        max_model_len: Optional[int] = None,
        attention: Optional[str] = None,
        linear: Optional[str] = None,
        dispatch_table: Optional[Union[str, os.PathLike]] = None,
        cuda_graphs: Optional[bool] = None,
        threads: Optional[int] = None,
        calibration: Optional[Union[str, os.PathLike]] = None,
        cpu_weights: Optional[str] = None,
        gpu_weights: Optional[str] = None,
        tensor_parallel_size: Optional[int] = None,
        load_format: Optional[str] = None,
        config: Optional[Union[str, os.PathLike]] = None,
        pdl: Optional[str] = None,
        decode_path: Optional[str] = None,
        prefill_attention: Optional[str] = None,
        step_log: Optional[Union[str, os.PathLike]] = None,
        gpu_memory_utilization: Optional[float] = None,
        enforce_eager: Optional[bool] = None,
        enable_prefix_caching: Optional[bool] = None,
        async_scheduling: Optional[bool] = None,
        kv_cache_dtype: Optional[str] = None,
        seed: Optional[int] = None,
        tokenizer: Optional[Union[str, os.PathLike]] = None,
        trust_remote_code: bool = False,
        quantization: Optional[str] = None,
        generation_config: Optional[Union[str, os.PathLike]] = "auto",
        **vllm_keywords: Any,
    ) -> None:
        # The keywords are the engine option table's (the CLI's flags): checked there, with the
        # CLI's ranges and messages. None keeps the table's default.
        if tensor_parallel is not None and tensor_parallel_size is not None and tensor_parallel != tensor_parallel_size:
            raise _bad(f"tensor_parallel={tensor_parallel} and tensor_parallel_size={tensor_parallel_size} differ")
        if model is not None and not os.fspath(model):
            raise _bad("model: an empty path (None means the default model)")
        unknown = sorted(k for k in vllm_keywords if k not in _VLLM_IGNORED)
        if unknown:
            raise TypeError(f"LLM() got unexpected keyword arguments: {', '.join(unknown)}")
        if vllm_keywords:
            warnings.warn(f"fdpp.LLM ignores vLLM's {', '.join(sorted(vllm_keywords))}: no effect in fdpp",
                          stacklevel=2)
        if not isinstance(trust_remote_code, bool):
            raise _bad(f"trust_remote_code: expected True or False, got {trust_remote_code!r}")
        if enforce_eager is not None and cuda_graphs is not None and enforce_eager == cuda_graphs:
            raise _bad(f"enforce_eager={enforce_eager} and cuda_graphs={cuda_graphs} contradict each other")
        self._seeds = None if seed is None or _check_param("seed", seed) == -1 else random.Random(seed)
        paths = {"model": model, "dispatch_table": dispatch_table, "calibration": calibration, "config": config,
                 "step_log": step_log}
        options = {k: (None if v is None else os.fspath(v)) for k, v in paths.items()}
        options.update(
            device=device, dtype=dtype, kv_cache_tokens=kv_cache_tokens,
            tensor_parallel=tensor_parallel if tensor_parallel is not None else tensor_parallel_size,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
            attention=attention, linear=linear, cuda_graphs=cuda_graphs, threads=threads, cpu_weights=cpu_weights,
            gpu_weights=gpu_weights,
            load_format=load_format, pdl=pdl, decode_path=decode_path, prefill_attention=prefill_attention,
            gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
            enable_prefix_caching=enable_prefix_caching, async_scheduling=async_scheduling, quantization=quantization,
            kv_cache_dtype=kv_cache_dtype,
        )
        self._m = _core.CoreModel.load(options)
        self._tokenizer: Optional[Tokenizer] = None
        if tokenizer is not None:
            self._check_tokenizer(tokenizer)
        self._generation_defaults = self._read_generation_config(generation_config)

    def _read_generation_config(self, generation_config: Any) -> dict:
        # vLLM's generation_config: "auto" takes the sampling defaults of the model folder's
        # generation_config.json, "vllm" (or None) ignores it, a folder names another one.
        if generation_config is None or generation_config == "vllm":
            return {}
        if not isinstance(generation_config, (str, os.PathLike)):
            raise _bad(f"generation_config: expected 'auto', 'vllm' or a folder, got {generation_config!r}")
        if generation_config == "auto":
            folder = self.model_path if os.path.isdir(self.model_path) else None
        else:
            folder = os.fspath(generation_config)
            if not os.path.isdir(folder):
                raise _bad(f"generation_config: {folder!r} is not 'auto', 'vllm' or a folder")
        path = None if folder is None else os.path.join(folder, "generation_config.json")
        if path is None or not os.path.exists(path):
            return {}
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise _bad(f"{path}: {e}") from None
        if not isinstance(data, dict):
            raise _bad(f"{path}: expected a JSON object")
        defaults = {ours: data[theirs] for theirs, ours in _GENERATION_FIELDS if data.get(theirs) is not None}
        try:
            SamplingParams(**defaults)
        except InvalidInputError as e:
            raise _bad(f"{path}: {e}") from None
        return defaults

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM's: the SamplingParams of generate(), chat() and stream() without any: vLLM's
        defaults with those the model's generation_config.json sets (temperature, top_k, top_p,
        min_p, repetition_penalty, max_new_tokens as max_tokens) in their place. A GGUF file has
        none. A new object each call."""
        return SamplingParams(**self._generation_defaults)

    def _check_tokenizer(self, tokenizer: Any) -> None:
        # vLLM code names the model again (tokenizer=model): that is the tokenizer fdpp uses.
        path = os.path.realpath(os.fspath(tokenizer))
        model = os.path.realpath(self.model_path)
        own = {model} if os.path.isdir(model) else {model, os.path.dirname(model)}
        if path not in own:
            raise _bad(f"tokenizer: {os.fspath(tokenizer)!r} is not the model's; fdpp reads the tokenizer from the "
                       f"model ({self.model_path}), so tokenizer takes only None or the model's own path")

    # ---- properties ----------------------------------------------------------------------------

    @property
    def model_path(self) -> str:
        """The resolved path of the loaded model."""
        return self._m.path

    @property
    def device(self) -> str:
        """"cpu" or "cuda": where the model runs."""
        return self._m.device

    @property
    def vocab_size(self) -> int:
        return self._m.vocab_size

    @property
    def max_model_len(self) -> int:
        """Tokens per sequence (prompt + generated)."""
        return self._m.max_model_len

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer; InvalidInputError for a bare checkpoint without tokenizer files."""
        if self._tokenizer is None:
            self._tokenizer = Tokenizer(self._m.tokenizer())  # raises for a bare checkpoint
        return self._tokenizer

    def get_tokenizer(self) -> Tokenizer:
        """vLLM's spelling of llm.tokenizer: a Tokenizer with HF's common methods."""
        return self.tokenizer

    def stats(self) -> dict:
        """The scheduler's counters (steps, generated tokens, preemptions, KV blocks, and the prefix
        cache's prefix_cache_queries / prefix_cache_hits in tokens, prefix_cache_evictions and
        kv_blocks_cached)."""
        return self._m.stats()

    # ---- generation ----------------------------------------------------------------------------

    def _prompt(self, p: Any, where: str) -> tuple[Optional[str], list[int]]:
        if isinstance(p, str):
            return p, self.tokenizer.encode(_text(where, p))
        if isinstance(p, dict) and "prompt_token_ids" in p:  # vLLM's TokensPrompt
            return None, _ids(where, p["prompt_token_ids"])
        if isinstance(p, dict) and "prompt" in p:  # vLLM's TextPrompt
            return self._prompt(p["prompt"], where)
        if isinstance(p, (bytes, bytearray)):
            raise _bad(f"{where}: expected a str or token ids, got bytes")
        return None, _ids(where, p)

    def _prompts(self, prompts: Any) -> list[tuple[Optional[str], list[int]]]:
        # One prompt: a str, or a flat sequence of ints. Several: a list of those.
        if isinstance(prompts, (str, dict)):
            return [self._prompt(prompts, "prompt")]
        if isinstance(prompts, (bytes, bytearray)) or not isinstance(prompts, Iterable):
            # bytes would iterate as ints, i.e. token ids nobody meant.
            raise _bad(f"prompts: expected a str, token ids, a dict or a list of those, got {type(prompts).__name__}")
        prompts = list(prompts)
        # A flat sequence of scalars is one prompt of token ids (floats among them are named there).
        if prompts and all(not isinstance(x, (str, bytes, bytearray, dict, Iterable)) for x in prompts):
            return [self._prompt(prompts, "prompt")]
        return [self._prompt(p, f"prompts[{i}]") for i, p in enumerate(prompts)]

    def _params(self, sampling_params: Any, n: int) -> list[SamplingParams]:
        if sampling_params is None:
            return [self.get_default_sampling_params()] * n
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * n
        params = list(sampling_params)
        if len(params) != n or not all(isinstance(p, SamplingParams) for p in params):
            raise _bad(f"sampling_params: expected a SamplingParams or a list of {n} of them")
        return params

    def _run(self, items: list[tuple[Optional[str], list[int]]], params: list[SamplingParams],
             use_tqdm: Union[bool, Callable[..., Any]]) -> list[RequestOutput]:
        # A prompt that leaves no room for a token in the context is refused alone, so that one long
        # prompt does not cost the batch; the others run as one job (max_tokens cut to fit there).
        outputs: list[Optional[RequestOutput]] = [None] * len(items)
        requests, where, counts = [], [], []
        for k, ((text, ids), sp) in enumerate(zip(items, params)):
            if ids and len(ids) >= self.max_model_len:
                outputs[k] = _refused(text, ids, f"the prompt ({len(ids)} tokens) leaves no room in the context "
                                                 f"size {self.max_model_len} (max_model_len) for a token")
                continue
            group = sp._requests(ids, self.max_model_len, self._seeds)
            requests.extend(group)
            where.append(k)
            counts.append(len(group))
        # Over the engine's requests (n per prompt with n > 1) and the refused prompts.
        refused = len(items) - len(where)
        bar = _progress_bar(use_tqdm, refused + len(requests))
        try:
            if bar is not None and refused:
                bar.update(refused)
            progress = None if bar is None else _BarUpdate(bar)
            results = self._m.generate(requests, progress) if requests else []
        finally:
            if bar is not None:
                bar.close()
        at = 0
        for k, count in zip(where, counts):
            sp = params[k]
            scored = sp.prompt_logprobs is not None
            token_text = self._token_text if sp.logprobs is not None or scored else None
            outputs[k] = _output(results[at:at + count], items[k][0], token_text, sp.logprobs is not None, scored)
            at += count
        return outputs  # type: ignore[return-value]

    def generate(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        use_tqdm: Union[bool, Callable[..., Any]] = True,
    ) -> list[RequestOutput]:
        """Generates for every prompt, all in one continuously batched job.

        prompts: a str, a list of token ids, or a list of either. sampling_params: one for all, or
        one per prompt (None: get_default_sampling_params()). Returns one RequestOutput per prompt,
        in order.
        use_tqdm: a tqdm progress bar over the prompts when tqdm is installed (as vLLM; a callable is
        the bar's class). A prompt that does not fit the context ends or is refused alone (see
        RequestOutput). Ctrl-C cancels every request and raises KeyboardInterrupt; the LLM stays usable.
        """
        items = self._prompts(prompts)
        params = self._params(sampling_params, len(items))
        if not items:
            return []
        return self._run(items, params, use_tqdm)

    def _conversations(self, messages: Any) -> list[list[tuple[str, str, str, list[tuple[str, str, str]]]]]:
        if isinstance(messages, (list, tuple)) and messages and isinstance(messages[0], (list, tuple)):
            return [_messages(c) for c in messages]
        return [_messages(messages)]

    def chat(
        self,
        messages: Union[Sequence[dict], Sequence[Sequence[dict]]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        use_tqdm: Union[bool, Callable[..., Any]] = True,
        chat_template_kwargs: Optional[dict] = None,
        tools: Optional[Sequence[dict]] = None,
    ) -> list[RequestOutput]:
        """Generates replies to a conversation ([{"role": "user", "content": "..."}]) or a list of
        conversations, rendered with the model's chat template as `fdpp generate --chat` does;
        use_tqdm and the context rules as generate()'s. chat_template_kwargs: the template's
        variables, as vLLM's ({"enable_thinking": False}: Qwen3 answers without reasoning).
        tools: OpenAI's tool definitions, given to the template as vLLM does (the outputs are the
        model's text; parse_tool_calls() finds the calls in it). Messages may carry OpenAI's
        tool_calls (assistant) and tool results (role "tool" with tool_call_id)."""
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
            raise _bad("chat: chat_template_kwargs must be a dict")
        thinking = _enable_thinking("chat: chat_template_kwargs", dict(chat_template_kwargs or {}))
        tool_texts = _tools("chat", tools)
        convs = self._conversations(messages)
        params = self._params(sampling_params, len(convs))
        rendered = [self._m.encode_chat(c, thinking, tool_texts) for c in convs]
        return self._run(rendered, params, use_tqdm)

    def parse_tool_calls(self, text: str) -> tuple[Optional[str], list[dict]]:
        """The tool calls in a chat output's text, as the server parses them for tool_choice
        "auto": (content, tool_calls), content being the text before the first call (None when
        only whitespace is) or the whole text when there is no call, and tool_calls OpenAI's
        [{"id", "type": "function", "function": {"name", "arguments"}}] (arguments: JSON text)."""
        tok = self._m.tokenizer()
        content, calls = tok.parse_tool_calls(_text("text", text))
        mistral = tok.tool_call_format == "mistral"  # its templates take 9-character ids
        out = [{"id": _call_id(mistral), "type": "function", "function": {"name": name, "arguments": args}}
               for name, args in calls]
        if out and not content.strip():
            return None, out
        return content, out

    def _token_text(self, token_id: int) -> Optional[str]:
        # Logprob.decoded_token: the token's own text (None for a checkpoint without a tokenizer).
        if not self._m.has_tokenizer:
            return None
        return self.get_tokenizer().decode([token_id])

    def stream(self, prompt: PromptType, sampling_params: Optional[SamplingParams] = None) -> Iterator[str]:
        """Yields the text of one prompt in pieces as it is decoded (whole characters, never part of
        a stop string; bytes left at the end by a stop mid-character come as U+FFFD); the pieces
        join to generate()'s text. Closing the generator early cancels the request."""
        items = self._prompts(prompt)
        if len(items) != 1:
            raise _bad("stream: expected one prompt (a str or a list of token ids)")
        (_, ids), = items
        sp = sampling_params if sampling_params is not None else self.get_default_sampling_params()
        if not isinstance(sp, SamplingParams):
            raise _bad("sampling_params: expected a SamplingParams")
        if sp.n != 1:
            raise _bad(f"stream: n = {sp.n} is not supported (one text stream per call)")
        s = self._m.stream(sp._request(ids, self.max_model_len, self._seeds))
        return _stream(s)

    # ---- logits --------------------------------------------------------------------------------

    def logits(self, token_ids: Sequence[int], as_torch: bool = False) -> "np.ndarray":
        """The logits of every position of one sequence: float32 [T, vocab].

        A numpy array (as `fdpp logits --token-ids ... --out F.npy` writes: on the CPU the same
        numbers bit for bit); with as_torch=True a torch.Tensor sharing the same memory (DLPack, no
        copy; the annotation names the numpy case). torch.from_dlpack(array) also works on the numpy array without a copy.
        """
        ids = _ids("token_ids", token_ids)
        if as_torch:
            try:
                import torch  # noqa: F401  (nanobind hands the tensor over through torch)
            except ImportError:
                raise _bad("as_torch=True needs torch installed") from None
        return self._m.logits(ids, as_torch)

    def __repr__(self) -> str:
        return f"LLM(model={self.model_path!r}, device={self.device!r})"


def _stream(s: "_core.CoreStream") -> Iterator[str]:
    finished = False
    try:
        while True:
            piece = s.next()
            if piece is None:
                finished = True
                r = s.result()
                if r is not None and r.finish_reason == "error":
                    raise EngineError(r.error)
                return
            yield piece
    finally:
        # The consumer stopped early (break, close, an exception): free the request's KV blocks.
        if not finished:
            s.cancel()
