"""SamplingParams' sampling fields as vLLM gives them meaning (issue 46): n, logprobs and
cumulative_logprob, presence and frequency penalties, min_tokens and logit_bias, on the default
model (CPU by default; FDPP_TEST_DEVICE=cuda runs them on the GPU's sampler)."""

from __future__ import annotations

import math

import pytest

import fdpp

PROMPT = "The capital of France is"
N = 8


def greedy(**kw) -> fdpp.SamplingParams:
    return fdpp.SamplingParams(temperature=0, max_tokens=kw.pop("max_tokens", N), **kw)


def test_logprobs_top_token_is_greedy_and_cumulative_is_their_sum(llm):
    plain = llm.generate(PROMPT, greedy(), use_tqdm=False)[0]
    out = llm.generate(PROMPT, greedy(logprobs=3), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == plain.token_ids  # asking changes nothing of the output
    assert len(out.logprobs) == len(out.token_ids)
    total = 0.0
    for tok, entry in zip(out.token_ids, out.logprobs):
        # The k most likely tokens and the sampled one (here the same: the sampled token is the top).
        assert len(entry) == 3 and tok in entry
        ranked = sorted(entry.items(), key=lambda kv: kv[1].rank)
        assert ranked[0][0] == tok and entry[tok].rank == 1
        assert [lp.rank for _, lp in ranked] == [1, 2, 3]
        assert ranked[0][1].logprob >= ranked[1][1].logprob >= ranked[2][1].logprob
        assert entry[tok].decoded_token == llm.get_tokenizer().decode([tok])
        total += entry[tok].logprob
    assert out.cumulative_logprob == pytest.approx(total, abs=1e-4)
    assert -100 < out.cumulative_logprob < 0
    # logprobs=0: the sampled token's alone; None: no logprobs at all.
    zero = llm.generate(PROMPT, greedy(logprobs=0), use_tqdm=False)[0].outputs[0]
    assert [list(e) for e in zero.logprobs] == [[t] for t in zero.token_ids]
    assert plain.outputs[0].logprobs is None and plain.outputs[0].cumulative_logprob is None


def test_prompt_logprobs_score_the_prompt_as_generation_scored_it(llm):
    # vLLM's prompt_logprobs: None for the first token, then {id: Logprob} with the prompt's token;
    # a greedy continuation given back as prompt scores as it did when it was generated.
    gen = llm.generate(PROMPT, greedy(logprobs=1), use_tqdm=False)[0]
    assert gen.prompt_logprobs is None
    ids = gen.prompt_token_ids + gen.outputs[0].token_ids[:3]
    scored = llm.generate({"prompt_token_ids": ids}, greedy(max_tokens=1, prompt_logprobs=2), use_tqdm=False)[0]
    lps = scored.prompt_logprobs
    assert len(lps) == len(ids) and lps[0] is None
    for tok, entry in zip(ids[1:], lps[1:]):
        assert tok in entry and len(entry) in (2, 3) and entry[tok].logprob <= 0
    n = len(gen.prompt_token_ids)
    for i, tok in enumerate(gen.outputs[0].token_ids[:3]):
        assert lps[n + i][tok].logprob == pytest.approx(gen.outputs[0].logprobs[i][tok].logprob, abs=1e-4)
        assert lps[n + i][tok].rank == 1  # greedy: the most likely token
    # n = 2 scores the prompt once (the first completion) and gives the same scores.
    two = llm.generate({"prompt_token_ids": ids}, fdpp.SamplingParams(n=2, temperature=1.0, seed=4, max_tokens=1,
                                                                      prompt_logprobs=2), use_tqdm=False)[0]
    assert len(two.outputs) == 2 and len(two.prompt_logprobs) == len(ids)
    for mine, ref in zip(two.prompt_logprobs[1:], lps[1:]):
        assert set(mine) == set(ref)
        assert [mine[t].logprob for t in ref] == pytest.approx([v.logprob for v in ref.values()], abs=1e-4)


def test_logprobs_are_of_the_raw_distribution(llm):
    # With temperature the sampled token need not be the top one, and its logprob is its rank's; the
    # values do not depend on the temperature (the model's own distribution, vLLM's default).
    sp = fdpp.SamplingParams(temperature=1.5, seed=3, max_tokens=N, logprobs=5, ignore_eos=True)
    hot = llm.generate(PROMPT, sp, use_tqdm=False)[0].outputs[0]
    for tok, entry in zip(hot.token_ids, hot.logprobs):
        assert entry[tok].rank >= 1 and entry[tok].logprob <= 0
        assert sum(math.exp(lp.logprob) for t, lp in entry.items() if lp.rank <= 5) <= 1 + 1e-4
    first_greedy = llm.generate(PROMPT, greedy(logprobs=5), use_tqdm=False)[0].outputs[0].logprobs[0]
    first_hot = hot.logprobs[0]
    for t, lp in first_greedy.items():
        assert first_hot[t].logprob == pytest.approx(lp.logprob, abs=1e-5)


def test_n_completions(llm):
    # Greedy: n identical completions; with temperature and a seed, distinct ones that repeat, the
    # first being the n = 1 request's.
    out = llm.generate(PROMPT, greedy(n=3), use_tqdm=False)[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in out.outputs}) == 1
    sp = fdpp.SamplingParams(temperature=1.0, seed=5, max_tokens=12, n=3, best_of=3)
    a = llm.generate([PROMPT, "Once upon a time"], sp, use_tqdm=False)
    b = llm.generate([PROMPT, "Once upon a time"], sp, use_tqdm=False)
    for ra, rb in zip(a, b):
        assert len(ra.outputs) == 3 and len({o.text for o in ra.outputs}) == 3
        assert [o.token_ids for o in ra.outputs] == [o.token_ids for o in rb.outputs]
        assert ra.text == ra.outputs[0].text
    single = llm.generate(PROMPT, fdpp.SamplingParams(temperature=1.0, seed=5, max_tokens=12), use_tqdm=False)[0]
    assert single.token_ids == a[0].outputs[0].token_ids
    with pytest.raises(fdpp.InvalidInputError, match="best_of: 2 with n = 3"):
        fdpp.SamplingParams(n=3, best_of=2)
    with pytest.raises(fdpp.InvalidInputError, match="stream: n = 2"):
        next(iter(llm.stream(PROMPT, fdpp.SamplingParams(n=2))))


def test_penalties_logit_bias_and_min_tokens(llm):
    prompt = "la la la la la la la la la la"
    base = llm.generate(prompt, greedy(max_tokens=16), use_tqdm=False)[0].token_ids
    for field in ("presence_penalty", "frequency_penalty"):
        pen = llm.generate(prompt, greedy(max_tokens=16, **{field: 2.0}), use_tqdm=False)[0].token_ids
        assert pen != base and len(set(pen)) > len(set(base)), field
    banned = llm.generate(prompt, greedy(max_tokens=16, logit_bias={base[0]: -100}), use_tqdm=False)[0].token_ids
    assert base[0] not in banned
    forced = llm.generate(prompt, greedy(max_tokens=16, logit_bias={base[0] + 1: 100.0}), use_tqdm=False)[0]
    assert forced.token_ids == [base[0] + 1] * 16
    # min_tokens: an answer that ends early goes on; its end-of-turn token is held back until then.
    msgs = [{"role": "user", "content": "Say OK."}]
    short = llm.chat(msgs, greedy(max_tokens=64), use_tqdm=False)[0]
    assert short.finish_reason == "stop"
    want = len(short.token_ids) + 5
    long = llm.chat(msgs, greedy(max_tokens=64, min_tokens=want), use_tqdm=False)[0]
    assert len(long.token_ids) >= want
    eos = llm.get_tokenizer().eos_token_id
    assert eos not in long.token_ids[: want - 1]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"logit_bias": {5: 101}}, '"logit_bias[5]" 101 must be in [-100, 100]'),
        ({"logit_bias": {"x": 1}}, "logit_bias key: expected a token id"),
        ({"logit_bias": [1]}, "logit_bias: expected a dict"),
        ({"logit_bias": {5: "big"}}, "logit_bias[5]: expected a number"),
        ({"min_tokens": 20, "max_tokens": 10}, "min_tokens: 20 exceeds max_tokens = 10"),
        ({"logprobs": 21}, '"logprobs" 21 must be in [0, 20]'),
    ],
)
def test_bad_sampling_fields_are_named(kwargs, message):
    with pytest.raises(fdpp.InvalidInputError) as e:
        fdpp.SamplingParams(**kwargs)
    assert message in str(e.value)


def test_a_logit_bias_id_outside_the_vocabulary_is_refused(llm):
    with pytest.raises(fdpp.InvalidInputError, match=r"logit_bias token id 49152 is out of range \[0, 49152\)"):
        llm.generate(PROMPT, greedy(logit_bias={49152: 1.0}), use_tqdm=False)


def test_cli_penalty_flags_equal_python(llm, cli):
    # llama.cpp's --presence-penalty / --frequency-penalty: the same tokens as SamplingParams' fields
    # (greedy, the same prompt), and different ones from no penalty.
    prompt = "la la la la la la la la la la"
    for flag, field in (("--presence-penalty", "presence_penalty"), ("--frequency-penalty", "frequency_penalty")):
        ref = cli.generate("--prompt", prompt, "--temperature", "0", "-n", "12", "--ignore-eos", flag, "1.5")
        out = llm.generate(prompt, greedy(max_tokens=12, ignore_eos=True, **{field: 1.5}), use_tqdm=False)[0]
        assert out.token_ids == ref["token_ids"], flag
        plain = llm.generate(prompt, greedy(max_tokens=12, ignore_eos=True), use_tqdm=False)[0]
        assert plain.token_ids != out.token_ids, flag
