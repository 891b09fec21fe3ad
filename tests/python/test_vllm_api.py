"""Python as vLLM users write it (issue 46, item 5): the tokenizer's HF surface, vLLM's LLM keywords,
vLLM's SamplingParams defaults, the tqdm bar, and prompts that do not fit the context."""

from __future__ import annotations

import sys
import types
import warnings
from pathlib import Path

import fdpp
import pytest

GREEDY = fdpp.SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


# ---- the tokenizer --------------------------------------------------------------------------------


def test_tokenizer_has_hf_common_surface(llm):
    tok = llm.get_tokenizer()
    enc = tok("Hello, world!")
    assert enc["input_ids"] == tok.encode("Hello, world!") and enc.input_ids == enc["input_ids"]
    assert enc["attention_mask"] == [1] * len(enc["input_ids"])
    batch = tok(["Hello", "The capital of France is"])
    assert batch["input_ids"] == [tok.encode("Hello"), tok.encode("The capital of France is")]
    assert [len(m) for m in batch["attention_mask"]] == [len(i) for i in batch["input_ids"]]
    assert tok.batch_decode(batch["input_ids"]) == ["Hello", "The capital of France is"]
    assert len(tok) == tok.vocab_size == llm.vocab_size

    # SmolLM2: <|im_end|> ends a turn; decode keeps special tokens unless told (HF's default).
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert (tok.bos_token is None) == (tok.bos_token_id is None)
    if tok.bos_token_id is not None:
        assert tok.convert_ids_to_tokens(tok.bos_token_id) == tok.bos_token
    ids = tok.encode("<|im_start|>user hi<|im_end|>", add_special_tokens=False)
    assert tok.decode(ids) == "<|im_start|>user hi<|im_end|>"
    assert tok.decode(ids, skip_special_tokens=True) == "user hi"
    assert tok.decode(ids[0]) == "<|im_start|>"
    tokens = tok.convert_ids_to_tokens(ids)
    assert tokens[0] == "<|im_start|>" and tokens[-1] == "<|im_end|>" and len(tokens) == len(ids)
    assert "<|im_end|>" not in tok.convert_ids_to_tokens(ids, skip_special_tokens=True)
    assert tok.convert_tokens_to_ids(tokens) == ids


def test_apply_chat_template_as_hf(llm):
    tok = llm.get_tokenizer()
    messages = [{"role": "user", "content": "What is 2+2?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    bare = tok.apply_chat_template(messages, tokenize=False)  # HF's default: no generation prompt
    assert not bare.endswith("<|im_start|>assistant\n") and text.startswith(bare)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True)  # HF's default: ids
    assert ids == tok.encode(text, add_special_tokens=False)
    # The ids LLM.chat runs are the template's with the generation prompt.
    (out,) = llm.chat(messages, GREEDY, use_tqdm=False)
    assert out.prompt_token_ids == ids and out.prompt == text
    with pytest.raises(fdpp.InvalidInputError, match="tokenize"):
        tok.apply_chat_template(messages, tokenize="no")


# ---- LLM's keywords -------------------------------------------------------------------------------


def test_vllm_keywords(default_model, device):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llm = fdpp.LLM(default_model, device=device, max_model_len=128, max_num_seqs=4, kv_cache_tokens=512,
                       gpu_memory_utilization=0.5, enforce_eager=True, seed=7, tokenizer=default_model,
                       trust_remote_code=True, quantization=None, enable_prefix_caching=True, swap_space=4)
    (w,) = [c for c in caught if "ignores" in str(c.message)]
    assert "swap_space" in str(w.message) and "enable_prefix_caching" not in str(w.message)  # it has a meaning
    assert "\n" not in str(w.message)

    # seed: requests without a seed of their own repeat from one LLM to the next.
    sp = fdpp.SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True)
    a = [o.token_ids for o in llm.generate(["Once upon a time"] * 3, sp, use_tqdm=False)]
    again = fdpp.LLM(default_model, device=device, max_model_len=128, max_num_seqs=4, kv_cache_tokens=512, seed=7)
    b = [o.token_ids for o in again.generate(["Once upon a time"] * 3, sp, use_tqdm=False)]
    assert a == b
    assert len({tuple(t) for t in a}) > 1  # one stream, a different seed per request


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"gpu_memory_utilization": 0}, fdpp.InvalidInputError, "gpu_memory_utilization: 0 must be in (0, 1]"),
        ({"gpu_memory_utilization": 1.5}, fdpp.InvalidInputError, "gpu_memory_utilization: 1.5 must be in (0, 1]"),
        ({"gpu_memory_utilization": "most"}, fdpp.InvalidInputError, "gpu_memory_utilization: expected a number"),
        ({"quantization": "bitsandbytes"}, fdpp.InvalidInputError, "quantization: 'bitsandbytes' is not one of none, fp8, int4, awq, gptq"),
        ({"quantization": "awq"}, fdpp.InvalidInputError, "quantization awq: "),
        ({"tokenizer": "/elsewhere/tokenizer"}, fdpp.InvalidInputError, "tokenizer: '/elsewhere/tokenizer' is not the model's"),
        ({"enforce_eager": True, "cuda_graphs": True}, fdpp.InvalidInputError, "contradict"),
        ({"seed": -2}, fdpp.InvalidInputError, '"seed" -2'),
        ({"enable_prefix_cachin": True}, TypeError, "enable_prefix_cachin"),
        ({"enable_prefix_caching": "yes"}, fdpp.InvalidInputError, "enable_prefix_caching"),
        ({"async_scheduling": "yes"}, fdpp.InvalidInputError, "async_scheduling"),
        ({"kv_cache_dtype": "fp8_e5m2"}, fdpp.InvalidInputError,
         "kv_cache_dtype: fp8_e5m2 is not supported: the fp8 KV cache is e4m3"),
        ({"kv_cache_dtype": "int8"}, fdpp.InvalidInputError,
         "kv_cache_dtype: 'int8' is not one of auto, f32, f16, fp8, fp8_e4m3"),
    ],
)
def test_vllm_keywords_refused_with_their_name(default_model, device, kwargs, error, words):
    with pytest.raises(error) as e:
        fdpp.LLM(default_model, device=device, max_model_len=128, max_num_seqs=4, kv_cache_tokens=512, **kwargs)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_fp8_weights_need_the_gpu(default_model):
    # quantization="fp8" is a CUDA feature: on the CPU it is refused by its keyword, before loading.
    with pytest.raises(fdpp.InvalidInputError) as e:
        fdpp.LLM(default_model, device="cpu", quantization="fp8", max_model_len=128)
    assert "quantization=fp8 runs on the CUDA backend" in str(e.value) and "device=cpu" in str(e.value)


# ---- SamplingParams' defaults ---------------------------------------------------------------------


def test_sampling_defaults_are_vllms():
    sp = fdpp.SamplingParams()
    assert (sp.temperature, sp.top_k, sp.top_p, sp.min_p, sp.repetition_penalty, sp.max_tokens) == (
        1.0, 0, 1.0, 0.0, 1.0, 16)
    assert sp.seed is None and sp.stop == [] and not sp.ignore_eos


def test_default_params_generate_sixteen_tokens(llm):
    assert llm.get_default_sampling_params() == fdpp.SamplingParams()  # a GGUF file has no generation_config
    (out,) = llm.generate("Once upon a time", fdpp.SamplingParams(ignore_eos=True), use_tqdm=False)
    assert len(out.token_ids) == 16 and out.finish_reason == "length"


# ---- the progress bar -----------------------------------------------------------------------------


class FakeBar:
    made: list["FakeBar"] = []

    def __init__(self, total, **kwargs):
        self.total, self.n, self.closed = total, 0, False
        FakeBar.made.append(self)

    def update(self, k):
        self.n += k

    def close(self):
        self.closed = True


@pytest.fixture
def fake_tqdm(monkeypatch):
    FakeBar.made = []
    package, auto = types.ModuleType("tqdm"), types.ModuleType("tqdm.auto")
    auto.tqdm = FakeBar
    package.auto = auto
    monkeypatch.setitem(sys.modules, "tqdm", package)
    monkeypatch.setitem(sys.modules, "tqdm.auto", auto)
    return FakeBar.made


def test_tqdm_bar_over_the_requests(llm, fake_tqdm):
    prompts = [[5] * llm.max_model_len] + ["Hello"] * 5  # one refused, counted too
    outs = llm.generate(prompts, GREEDY)
    (bar,) = fake_tqdm
    assert bar.total == bar.n == 6 and bar.closed
    llm.chat([{"role": "user", "content": "Hi"}], GREEDY)
    assert len(fake_tqdm) == 2 and fake_tqdm[1].n == 1
    llm.generate("Hello", GREEDY, use_tqdm=False)
    assert len(fake_tqdm) == 2
    assert [o.finish_reason for o in outs] == ["error"] + ["length"] * 5
    # n completions per prompt: the bar counts the engine's requests, ending full.
    llm.generate(["Hello", "Hi"], fdpp.SamplingParams(temperature=0, max_tokens=2, n=3))
    assert fake_tqdm[-1].total == fake_tqdm[-1].n == 6 and fake_tqdm[-1].closed


def test_without_tqdm_no_bar_and_no_complaint(llm, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (out,) = llm.generate("Hello", GREEDY)
    assert len(out.token_ids) == 4


def test_a_failing_bar_does_not_fail_the_generation(llm, monkeypatch):
    class Broken(FakeBar):
        def update(self, k):
            raise RuntimeError("display gone")

    # Only the message is kept: the report's traceback holds frames, whose locals hold the LLM.
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: reported.append(str(report.exc_value)))
    outs = llm.generate(["Hello"] * 2, GREEDY, use_tqdm=Broken)  # a callable is the bar's class, as vLLM's
    assert [len(o.token_ids) for o in outs] == [4, 4]
    assert reported and reported[0] == "display gone"


def test_ctrl_c_inside_the_bar_still_interrupts(llm):
    # Python runs Ctrl-C's handler in whatever Python code the main thread runs: with a bar, often
    # the bar's update. It must cancel the job as Ctrl-C elsewhere does, not be swallowed.
    class Interrupted(FakeBar):
        def update(self, k):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        llm.generate(["Hello", "Once upon a time"], fdpp.SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
                     use_tqdm=Interrupted)
    assert llm.stats()["running"] == 0 and llm.stats()["waiting"] == 0
    (out,) = llm.generate("Hello", GREEDY, use_tqdm=False)
    assert len(out.token_ids) == 4


# ---- prompts that do not fit ----------------------------------------------------------------------


def test_a_prompt_too_long_for_max_tokens_ends_with_length_alone(llm):
    room = 6
    long_prompt = [5] * (llm.max_model_len - room)
    sp = fdpp.SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    short, cut = llm.generate(["Hello", long_prompt], [GREEDY, sp], use_tqdm=False)
    assert len(short.token_ids) == 4 and short.finish_reason == "length"
    assert len(cut.token_ids) == room and cut.finish_reason == "length" and cut.error is None


def test_a_prompt_that_does_not_fit_is_refused_alone(llm):
    too_long = [5] * (llm.max_model_len + 3)
    a, refused, b = llm.generate(["Hello", too_long, "Water boils at"], GREEDY, use_tqdm=False)
    assert a.finish_reason == b.finish_reason == "length" and len(a.token_ids) == len(b.token_ids) == 4
    assert refused.finish_reason == "error" and refused.token_ids == [] and refused.text == ""
    assert refused.prompt_token_ids == too_long
    assert f"({len(too_long)} tokens)" in refused.error and "max_model_len" in refused.error
    assert refused.outputs[0].finish_reason == "error" and refused.outputs[0].error == refused.error
    assert llm.stats()["running"] == 0 and llm.stats()["waiting"] == 0
    # stream() has one prompt: there it is an error.
    with pytest.raises(fdpp.InvalidInputError, match="context"):
        list(llm.stream(too_long, GREEDY))


# ---- generation_config.json -----------------------------------------------------------------------


def hf_model_with(tmp_path, generation_config: str):
    # A copy of a fixture folder (links to its files) with the generation_config.json given.
    src = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "hf" / "qwen2_tied_gqa_bf16"
    for f in src.iterdir():
        if f.name != "generation_config.json":
            (tmp_path / f.name).symlink_to(f)
    (tmp_path / "generation_config.json").write_text(generation_config)
    return tmp_path


def test_generation_config_sets_the_default_params(tmp_path, device):
    folder = hf_model_with(tmp_path, '{"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05, '
                                     '"max_new_tokens": 5, "do_sample": true, "eos_token_id": 2}')
    llm = fdpp.LLM(folder, device=device, kv_cache_tokens=1024)
    expected = fdpp.SamplingParams(temperature=0.6, top_p=0.9, top_k=20, repetition_penalty=1.05, max_tokens=5)
    assert llm.get_default_sampling_params() == expected
    assert llm.get_default_sampling_params() is not llm.get_default_sampling_params()
    (out,) = llm.generate([[1, 2, 3]], use_tqdm=False)  # no params: the model's defaults
    assert len(out.token_ids) <= 5
    vllm_only = fdpp.LLM(folder, device=device, kv_cache_tokens=1024, generation_config="vllm")
    assert vllm_only.get_default_sampling_params() == fdpp.SamplingParams()
    ignored = fdpp.LLM(folder, device=device, kv_cache_tokens=1024, generation_config=None)
    assert ignored.get_default_sampling_params() == fdpp.SamplingParams()


def test_a_bad_generation_config_is_named(tmp_path, device):
    folder = hf_model_with(tmp_path, '{"temperature": -1}')
    with pytest.raises(fdpp.InvalidInputError, match=r"generation_config.json: .*temperature"):
        fdpp.LLM(folder, device=device, kv_cache_tokens=1024)


# ---- chat template variables (Qwen3's thinking switch) ---------------------------------------------


def test_qwen3_enable_thinking(device):
    import json
    d = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "hf" / "qwen3_tied_gqa_bf16"
    ref = json.loads((d / "reference.json").read_text())
    llm = fdpp.LLM(d, device=device, kv_cache_tokens=1024)
    tok = llm.get_tokenizer()
    # The tokenizer renders as transformers' apply_chat_template did, keyword for keyword.
    for chat in ref["chat"]:
        kw = {"enable_thinking": chat["enable_thinking"]} if "enable_thinking" in chat else {}
        assert tok.apply_chat_template(chat["messages"], tokenize=False,
                                       add_generation_prompt=chat["add_generation_prompt"], **kw) == chat["rendered"]
    conv = [{"role": "user", "content": "Hi!"}]
    (off,) = llm.chat(conv, GREEDY, use_tqdm=False, chat_template_kwargs={"enable_thinking": False})
    (on,) = llm.chat(conv, GREEDY, use_tqdm=False)
    assert off.prompt == "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert on.prompt == "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    assert off.prompt_token_ids == tok.apply_chat_template(conv, add_generation_prompt=True, enable_thinking=False)
    with pytest.raises(fdpp.InvalidInputError, match="foo not supported"):
        llm.chat(conv, GREEDY, use_tqdm=False, chat_template_kwargs={"foo": 1})
    with pytest.raises(fdpp.InvalidInputError, match="enable_thinking must be"):
        tok.apply_chat_template(conv, enable_thinking="no")


# ---- vLLM's snippets, as their docs write them ------------------------------------------------------


def test_vllm_quickstart_and_chat_snippets(default_model, device, fake_tqdm):
    from fdpp import LLM, SamplingParams

    # vLLM's quickstart, with the model's path for its hub name.
    prompts = ["Hello, my name is", "The president of the United States is", "The capital of France is",
               "The future of AI is"]
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=4)
    llm = LLM(model=default_model, device=device, max_model_len=256, gpu_memory_utilization=0.5, seed=0,
              trust_remote_code=True)
    outputs = llm.generate(prompts, sampling_params)
    for output in outputs:
        assert isinstance(output.prompt, str) and isinstance(output.outputs[0].text, str)
        assert 1 <= len(output.outputs[0].token_ids) <= 4
    # A chat through the template, rendered by the tokenizer as vLLM users do it by hand.
    tokenizer = llm.get_tokenizer()
    conversation = [{"role": "system", "content": "You are a helpful assistant"},
                    {"role": "user", "content": "Hello"}]
    text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    (by_hand,) = llm.generate(text, SamplingParams(temperature=0, max_tokens=4))
    (by_chat,) = llm.chat(conversation, SamplingParams(temperature=0, max_tokens=4))
    assert by_hand.outputs[0].token_ids == by_chat.outputs[0].token_ids
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text  # the tokenizer round trip
    # 100 prompts under one progress bar.
    outs = llm.generate([f"Prompt number {i}:" for i in range(100)], SamplingParams(temperature=0, max_tokens=1))
    assert len(outs) == 100 and all(len(o.token_ids) == 1 for o in outs)
    assert fake_tqdm[-1].total == fake_tqdm[-1].n == 100


# ---- prefix caching -------------------------------------------------------------------------------


def test_enable_prefix_caching_reuses_a_shared_beginning(default_model, device):
    # A long shared instruction before two questions: the second request (run after the first) maps
    # the first's cached blocks (num_cached_tokens, whole blocks of 16) and generates the same tokens
    # as an LLM with enable_prefix_caching=False.
    instruction = "You answer questions about geography. Keep every answer short and plain. " * 3
    prompts = [instruction + "Question: what is the capital of France?",
               instruction + "Question: what is the capital of Spain?"]
    greedy = fdpp.SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = {}
    for caching in (True, False):
        llm = fdpp.LLM(default_model, device=device, max_model_len=256, max_num_seqs=4, kv_cache_tokens=1024,
                       enable_prefix_caching=caching)
        outs[caching] = [llm.generate(p, greedy, use_tqdm=False)[0] for p in prompts]
        if caching:
            assert llm.stats()["prefix_cache_hits"] == outs[True][1].num_cached_tokens
    on, off = outs[True], outs[False]
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    assert on[0].num_cached_tokens == 0 and off[1].num_cached_tokens == 0
    n = on[1].num_cached_tokens
    assert n > 16 and n % 16 == 0 and n < len(on[1].prompt_token_ids)
    common = next(i for i, (a, b) in enumerate(zip(*(o.prompt_token_ids for o in on))) if a != b)
    assert n == common // 16 * 16  # every whole block of the shared beginning


def test_async_scheduling_changes_no_output(default_model, device):
    # async_scheduling (the GPU's overlapped steps; the CPU engine never overlaps) gives the same
    # tokens as steps run one at a time, stop strings and seeded sampling included, and leaves the
    # engine free for logits() between calls.
    prompts = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,"]
    params = [fdpp.SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
              fdpp.SamplingParams(temperature=0.8, seed=7, max_tokens=12, ignore_eos=True),
              fdpp.SamplingParams(temperature=0, max_tokens=12, stop=[" 8"])]
    outs = {}
    for overlap in (True, False):
        llm = fdpp.LLM(default_model, device=device, max_model_len=256, max_num_seqs=4, kv_cache_tokens=1024,
                       async_scheduling=overlap)
        outs[overlap] = llm.generate(prompts, params, use_tqdm=False)
        ids = outs[overlap][0].prompt_token_ids
        assert llm.logits(ids).shape == (len(ids), llm.vocab_size)
    for a, b in zip(outs[True], outs[False]):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].text == b.outputs[0].text
        assert a.outputs[0].finish_reason == b.outputs[0].finish_reason


@pytest.mark.parametrize("spelling", ["fp8", "fp8_e4m3"])
def test_kv_cache_dtype_fp8_needs_the_gpu(default_model, spelling):
    # The e4m3 KV cache is the CUDA backend's: on the CPU it is refused by its keyword, before loading.
    with pytest.raises(fdpp.InvalidInputError) as e:
        fdpp.LLM(default_model, device="cpu", max_model_len=128, kv_cache_tokens=256, kv_cache_dtype=spelling)
    message = str(e.value)
    assert "kv_cache_dtype=fp8" in message and "runs on the CUDA backend" in message and "device=cpu" in message
    assert "\n" not in message


def test_kv_cache_dtype_fp8_on_the_gpu(default_model, device):
    # vLLM's kv_cache_dtype="fp8" passes through to the CUDA engine: it generates, and greedy tokens
    # mostly follow the 16-bit cache's (e4m3 keeps 3 mantissa bits; the GPU tests bound the logits).
    if device != "cuda":
        pytest.skip("the fp8 KV cache is the CUDA backend's (FDPP_TEST_DEVICE=cuda)")
    greedy = fdpp.SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    kw = dict(device="cuda", max_model_len=128, max_num_seqs=2, kv_cache_tokens=256)
    fp8 = fdpp.LLM(default_model, kv_cache_dtype="fp8", **kw).generate("The capital of France is", greedy,
                                                                       use_tqdm=False)[0]
    auto = fdpp.LLM(default_model, **kw).generate("The capital of France is", greedy, use_tqdm=False)[0]
    assert len(fp8.outputs[0].token_ids) == 8
    assert fp8.outputs[0].token_ids[0] == auto.outputs[0].token_ids[0]


def test_kv_cache_dtype_f16_on_the_cpu(default_model):
    # The CPU's f16 KV cache: the same model generates, close to the fp32 cache's logits.
    greedy = fdpp.SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    out = fdpp.LLM(default_model, device="cpu", max_model_len=128, max_num_seqs=2, kv_cache_tokens=256,
                   kv_cache_dtype="f16").generate("The capital of France is", greedy, use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 8
