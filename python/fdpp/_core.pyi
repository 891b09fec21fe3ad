# Type stubs of fdpp's C++ extension (python/src/bindings.cpp). The public API is fdpp's
# __init__.py (LLM, SamplingParams, RequestOutput, Tokenizer); these classes are its internals.
from typing import Any, Callable, Optional, Union

import numpy as np
import numpy.typing as npt

class FdppError(Exception):
    """Base class of every error fdpp raises."""

class InvalidInputError(FdppError, ValueError):
    """Bad input: a missing or corrupt model file, an argument out of range, a prompt that does not fit."""

class EngineError(FdppError, RuntimeError):
    """The engine failed while computing (a CUDA error, out of device memory)."""

cuda_built: bool
max_stop_token_ids: int

def default_model_path() -> str: ...

# The table of request limits (src/engine/request_limits.h): "" when allowed, else the message.
def request_param_problem(name: str, value: Any) -> str: ...
def request_list_problem(name: str, count: int) -> str: ...
def stop_string_problem(text: str) -> str: ...

class CoreSampling:
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float
    repeat_last_n: int
    seed: int
    presence_penalty: float
    frequency_penalty: float
    min_tokens: int
    logprobs: int
    logit_bias: list[tuple[int, float]]
    def __init__(self) -> None: ...

class CoreRequest:
    prompt: list[int]
    sampling: CoreSampling
    max_tokens: int
    ignore_eos: bool
    stop: list[str]
    stop_token_ids: list[int]
    def __init__(self) -> None: ...
    def set_grammar(self, grammar: CoreGrammar) -> None: ...

class CoreGrammar: ...

def compile_grammar(kind: str, spec: str = "", choices: list[str] = ...) -> CoreGrammar: ...

class CoreResult:
    @property
    def id(self) -> int: ...
    @property
    def prompt(self) -> list[int]: ...
    @property
    def token_ids(self) -> list[int]: ...
    @property
    def text(self) -> str: ...
    @property
    def finish_reason(self) -> str: ...
    @property
    def error(self) -> str: ...
    @property
    def logprobs(self) -> list[tuple[float, int, list[tuple[int, float]]]]:
        """Per generated token: (logprob, rank, [(id, logprob) of the top k])."""
    @property
    def cumulative_logprob(self) -> float: ...
    @property
    def stop_reason(self) -> Union[int, str, None]:
        """What ended a "stop": a stop token id, a stop string, or None (end of generation, or not a stop)."""
    @property
    def preemptions(self) -> int: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def time_to_first_token(self) -> float: ...
    @property
    def total_time(self) -> float: ...
    @property
    def time_per_output_token(self) -> float: ...

class CoreStream:
    def next(self) -> Optional[str]:
        """The next piece of text; None once the request has finished."""
    def cancel(self) -> None:
        """Cancels the request and waits until its KV blocks are free."""
    def result(self) -> Optional[CoreResult]:
        """The finished request's result; None before it has finished."""

# (role, content, tool_call_id, [(call id, function name, arguments JSON)])
_Message = tuple[str, str, str, list[tuple[str, str, str]]]

class CoreTokenizer:
    def encode(self, text: str, add_bos: Optional[bool] = None, parse_special: bool = True) -> list[int]: ...
    def decode(self, ids: list[int], skip_special: bool = True) -> str: ...
    def apply_chat_template(self, messages: list[_Message], add_generation_prompt: bool = True,
                            enable_thinking: Optional[bool] = None, tools: list[str] = ...) -> str: ...
    @property
    def tool_call_format(self) -> str:
        """How the chat template has the model write a call: "hermes", "llama3_json" or "mistral"."""
    def parse_tool_calls(self, text: str) -> tuple[str, list[tuple[str, str]]]:
        """(content, [(name, arguments JSON)]): the calls in a model's output, in that format."""
    def token_to_id(self, token: str) -> Optional[int]: ...
    def id_to_token(self, id: int) -> str: ...
    def is_special(self, id: int) -> bool: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def bos_token_id(self) -> Optional[int]: ...
    @property
    def eos_token_id(self) -> Optional[int]: ...
    @property
    def add_bos_by_default(self) -> bool: ...

class CoreModel:
    @staticmethod
    def load(options: dict[str, Optional[object]]) -> CoreModel:
        """Opens a model; options are the engine option table's keywords (None: the default)."""
    @property
    def path(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def architecture(self) -> str: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def has_tokenizer(self) -> bool: ...
    def generate(
        self, requests: list[CoreRequest], progress: Optional[Callable[[int], object]] = None
    ) -> list[CoreResult]:
        """Runs the requests as one job; progress(finished) is called as requests finish."""
    def stream(self, request: CoreRequest) -> CoreStream: ...
    def logits(self, token_ids: list[int], as_torch: bool = False) -> npt.NDArray[np.float32] | Any: ...
    def encode_chat(self, messages: list[_Message], enable_thinking: Optional[bool] = None,
                    tools: list[str] = ...) -> tuple[str, list[int]]: ...
    def tokenizer(self) -> CoreTokenizer: ...
    def stats(self) -> dict[str, int]: ...

def derived_seed(seed: int, choice: int) -> int: ...
