"""generate / chat / stream against the CLI and against themselves (batch vs single)."""

from __future__ import annotations

import gc

import fdpp
import pytest

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at",
    "My favourite book is",
    "In 1969, humans",
    "The quick brown fox",
    "To make a cup of tea,",
    "The largest planet in the solar system is",
    "SELECT * FROM",
    "Photosynthesis is the process",
    "Dear Sir or Madam,",
    "The meaning of life is",
    "1, 2, 3, 4,",
    "Bonjour, je m'appelle",
]
N = 8  # tokens per request: enough to leave the prompt, small enough for a loaded 2-core CI machine

GREEDY = fdpp.SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)


def test_greedy_equals_cli(llm, cli):
    prompt = PROMPTS[0]
    ref = cli.generate("--prompt", prompt, "--temperature", "0", "-n", str(N), "--ignore-eos")
    (out,) = llm.generate(prompt, GREEDY)
    assert out.prompt == prompt
    assert out.prompt_token_ids == ref["prompt_token_ids"]
    assert out.token_ids == ref["token_ids"]
    assert out.text == ref["text"]
    assert out.finish_reason == ref["finish_reason"] == "length"
    assert out.outputs[0].token_ids == out.token_ids  # vLLM's shape too


def test_token_id_prompt_and_chat_equal_cli(llm, cli):
    ids = llm.tokenizer.encode(PROMPTS[1])
    ref = cli.generate("--token-ids", ",".join(map(str, ids)), "--temperature", "0", "-n", str(N), "--ignore-eos")
    (out,) = llm.generate([ids], GREEDY)
    assert out.prompt is None and out.prompt_token_ids == ids
    assert out.token_ids == ref["token_ids"]

    ref = cli.generate("--prompt", "What is 2+2?", "--chat", "--temperature", "0", "-n", str(N))
    (out,) = llm.chat([{"role": "user", "content": "What is 2+2?"}], fdpp.SamplingParams(temperature=0, max_tokens=N))
    assert out.prompt_token_ids == ref["prompt_token_ids"]
    assert out.token_ids == ref["token_ids"]
    assert "<|im_start|>assistant" in out.prompt


def test_batch_of_16_equals_16_single_calls(llm):
    # Greedy and seeded sampling: each request's draws depend on its seed and the logits only.
    params = [
        GREEDY if i % 2 == 0 else fdpp.SamplingParams(temperature=0.9, seed=1000 + i, max_tokens=N, ignore_eos=True)
        for i in range(len(PROMPTS))
    ]
    batch = llm.generate(PROMPTS, params)
    assert [o.prompt for o in batch] == PROMPTS
    singles = [llm.generate(p, sp)[0] for p, sp in zip(PROMPTS, params)]
    for b, s in zip(batch, singles):
        assert (b.prompt, b.token_ids, b.text, b.finish_reason) == (s.prompt, s.token_ids, s.text, s.finish_reason)
        assert len(b.token_ids) == N
    assert llm.stats()["running"] == 0 and llm.stats()["waiting"] == 0


def test_stream_pieces_join_to_the_text(llm):
    for sp in (GREEDY, fdpp.SamplingParams(temperature=1.0, seed=7, max_tokens=N)):
        pieces = list(llm.stream(PROMPTS[2], sp))
        (full,) = llm.generate(PROMPTS[2], sp)
        assert pieces and all(isinstance(p, str) and p for p in pieces)
        assert "".join(pieces) == full.text


def test_text_cut_mid_character_is_a_str(llm):
    # Emoji are several byte-level tokens: stopping after the first of them leaves bytes that are not
    # UTF-8 at the end. Every API hands them out as U+FFFD (the scheduler's last piece used to raise
    # UnicodeDecodeError in stream()), and the pieces still join to generate()'s text.
    cut = 0
    for prompt in ("Write five emojis: \U0001F600 \U0001F389 \U0001F680", "Reply with one emoji only:"):
        for n in (1, 2, 3):
            sp = fdpp.SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
            pieces = list(llm.stream(prompt, sp))
            (full,) = llm.generate(prompt, sp)
            assert "".join(pieces) == full.text
            assert full.text == llm.tokenizer.decode(full.token_ids, skip_special_tokens=True)
            cut += full.text.endswith("\ufffd")
    assert cut > 0, "no output ended mid-character: the prompts no longer test what they should"


def test_max_tokens_none_runs_to_the_end_of_the_context(llm):
    # vLLM's max_tokens=None: the rest of max_model_len (512 here) after the prompt.
    sp = fdpp.SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)
    (out,) = llm.generate(PROMPTS[0], sp)
    assert len(out.prompt_token_ids) + len(out.token_ids) == llm.max_model_len
    assert out.finish_reason == "length"
    (full,) = llm.generate([[5] * llm.max_model_len], sp)  # no room left: refused alone
    assert full.finish_reason == "error" and "context" in full.error


def test_stream_closed_early_frees_the_request(llm):
    sp = fdpp.SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    it = llm.stream(PROMPTS[3], sp)
    next(it)
    it.close()  # cancels the request: nothing is left running
    assert llm.stats()["running"] == 0
    (out,) = llm.generate(PROMPTS[3], GREEDY)
    assert len(out.token_ids) == N

    # Dropped without being iterated: the request is cancelled, and the next call's steps end it
    # instead of decoding its 64 tokens.
    it = llm.stream(PROMPTS[4], sp)
    del it
    gc.collect()
    before = llm.stats()["generated_tokens"]
    llm.generate(PROMPTS[3], GREEDY)
    s = llm.stats()
    assert s["running"] == 0 and s["waiting"] == 0
    assert s["generated_tokens"] - before < N + 8


def test_stop_strings_and_finish_reasons(llm):
    (free,) = llm.generate(PROMPTS[0], GREEDY)
    # A stop string taken from the greedy text itself must cut the text before it.
    words = free.text.split()
    assert words, free.text
    stop = words[min(1, len(words) - 1)]
    (cut,) = llm.generate(PROMPTS[0], fdpp.SamplingParams(temperature=0, max_tokens=N, ignore_eos=True, stop=[stop]))
    assert cut.finish_reason == "stop"
    assert stop not in cut.text
    assert free.text.startswith(cut.text)
    assert cut.outputs[0].stop_reason == stop  # vLLM's: the stop string that ended it

    (one,) = llm.generate(PROMPTS[0], fdpp.SamplingParams(temperature=0, max_tokens=1))
    assert one.finish_reason == "length" and len(one.token_ids) == 1
    assert one.outputs[0].stop_reason is None
    m = one.metrics
    assert 0 < m.time_to_first_token <= m.total_time and m.preemptions == 0


def test_stop_token_ids(llm):
    # An id from the middle of the greedy output ends it at that id's first occurrence, ignore_eos or
    # not: kept in token_ids, out of the text.
    sp = fdpp.SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    (free,) = llm.generate(PROMPTS[0], sp)
    stop_id = free.token_ids[len(free.token_ids) // 2]
    first = free.token_ids.index(stop_id)
    (cut,) = llm.generate(PROMPTS[0], fdpp.SamplingParams(temperature=0, max_tokens=N, ignore_eos=True,
                                                          stop_token_ids=[stop_id]))
    assert cut.finish_reason == "stop"
    assert cut.outputs[0].stop_reason == stop_id
    assert cut.token_ids == free.token_ids[: first + 1]
    assert cut.text == llm.tokenizer.decode(free.token_ids[:first], skip_special_tokens=True)
    with pytest.raises(fdpp.InvalidInputError, match=r"stop token id 49152 is out of range \[0, 49152\)"):
        llm.generate(PROMPTS[0], fdpp.SamplingParams(stop_token_ids=[49152]))


def test_sampling_is_seeded(llm):
    sp = fdpp.SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=42, max_tokens=N, ignore_eos=True)
    a = llm.generate(PROMPTS[4], sp)[0].token_ids
    b = llm.generate(PROMPTS[4], sp)[0].token_ids
    assert a == b
    outs = llm.generate([PROMPTS[4]] * 4, [fdpp.SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0,
                                                              seed=s, max_tokens=N, ignore_eos=True)
                                          for s in range(4)])
    assert len({tuple(o.token_ids) for o in outs}) > 1  # different seeds, different draws


def test_tokenizer_roundtrip(llm):
    t = llm.tokenizer
    ids = t.encode("Hello, world!")
    assert t.decode(ids) == "Hello, world!"
    assert t.vocab_size == llm.vocab_size
    assert t.id_to_token(ids[0]) and t.token_to_id(t.id_to_token(ids[0])) == ids[0]
    assert t.token_to_id("<|im_end|>") is not None
    assert t.decode(t.encode("<|im_start|>user"), skip_special_tokens=False) == "<|im_start|>user"
