"""fdpp serve end to end on the CPU with the default model (SmolLM2-135M-Instruct): the official
openai client for the happy paths, plain HTTP (httpx) for errors, cancellation, overload and
shutdown. Outputs are kept short (a few tokens) so the file runs in about a minute on 2 cores."""
import concurrent.futures
import functools
import json
import os
import signal
import socket
import subprocess
import threading
import time

import httpx
import openai
import pytest

from conftest import FDPP, ORIGIN, ROOT, start

N = 8  # tokens per request where the length does not matter


def client(server, **kw):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, **kw)


@functools.lru_cache(maxsize=None)
def generate_reference(prompt, n, chat=False):
    """What `fdpp generate --temperature 0` makes of the same prompt: token ids and text. Run one at
    a time: several OpenMP processes on 2 cores slow each other down by orders of magnitude."""
    args = [FDPP, "generate", "--device", "cpu", "--prompt", prompt, "-n", str(n), "--temperature", "0", "--json"]
    if chat:
        args.append("--chat")
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=120).stdout
    j = json.loads(out)
    return j["token_ids"], j["text"]


def sse_events(response):
    """The data of each server-sent event of an httpx streaming response, [DONE] included."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield line[len("data: "):]


def test_health_and_models(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    version = subprocess.run([FDPP, "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]
    assert httpx.get(server.url + "/version").json() == {"version": version}
    models = client(server).models.list().data
    assert [m.id for m in models] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]


def test_completion(server):
    c = client(server)
    r = c.completions.create(model=server.model_id, prompt="The capital of France is", max_tokens=N, temperature=0)
    ids, text = generate_reference("The capital of France is", N)
    assert r.choices[0].text == text
    assert r.choices[0].finish_reason == ("length" if len(ids) == N else "stop")
    assert r.usage.completion_tokens == len(ids)
    assert r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + len(ids)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")


def test_completion_token_ids_prompt_and_stop(server):
    c = client(server)
    ids, text = generate_reference("One, two, three, four,", N)
    prompt_ids = c.completions.create(model=server.model_id, prompt="One, two, three, four,", max_tokens=1,
                                      temperature=0, extra_body={"return_token_ids": True}).choices[0].prompt_token_ids
    # The same prompt as token ids gives the same tokens.
    r = c.completions.create(model=server.model_id, prompt=prompt_ids, max_tokens=N, temperature=0,
                             extra_body={"return_token_ids": True})
    assert r.choices[0].token_ids == ids and r.choices[0].text == text
    # A stop string cuts the text before it and finishes with "stop".
    stop = text.strip()[:3]
    r = c.completions.create(model=server.model_id, prompt="One, two, three, four,", max_tokens=N, temperature=0,
                             stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == text[: text.index(stop)]
    assert r.choices[0].model_extra["stop_reason"] == stop  # vLLM's field: what ended it


def test_batch_of_prompts_and_stop_token_ids(server):
    # OpenAI's batch: a list of prompts gives a choice per prompt, in order, each what the prompt
    # gets alone; usage is the sum.
    c = client(server)
    prompts = ["The capital of France is", "One, two, three, four,"]
    r = c.completions.create(model=server.model_id, prompt=prompts, max_tokens=N, temperature=0)
    assert [ch.index for ch in r.choices] == [0, 1]
    refs = [generate_reference(p, N) for p in prompts]
    assert [ch.text for ch in r.choices] == [text for _, text in refs]
    assert r.usage.completion_tokens == sum(len(ids) for ids, _ in refs)
    # Streamed, the chunks of both prompts interleave as they decode, told apart by their index; each
    # ends with its own finish_reason, and the usage chunk sums the two.
    texts, finishes, usage = ["", ""], [[], []], None
    for chunk in c.completions.create(model=server.model_id, prompt=prompts, max_tokens=N, temperature=0,
                                      stream=True, stream_options={"include_usage": True}):
        if not chunk.choices:
            usage = chunk.usage
            continue
        (ch,) = chunk.choices
        texts[ch.index] += ch.text
        if ch.finish_reason is not None:
            finishes[ch.index].append(ch.finish_reason)
    assert texts == [text for _, text in refs]
    assert finishes == [[ch.finish_reason] for ch in r.choices]
    assert (usage.prompt_tokens, usage.completion_tokens) == (r.usage.prompt_tokens, r.usage.completion_tokens)
    # vLLM's stop_token_ids: the output ends at the first of them, which token_ids keeps.
    ids, _ = refs[1]
    stop_id = ids[len(ids) // 2]
    r = c.completions.create(model=server.model_id, prompt=prompts[1], max_tokens=N, temperature=0,
                             extra_body={"stop_token_ids": [stop_id], "return_token_ids": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].token_ids == ids[: ids.index(stop_id) + 1]


def test_chat_and_stream(server):
    c = client(server)
    msgs = [{"role": "user", "content": "What is 2 + 2?"}]
    r = c.chat.completions.create(model=server.model_id, messages=msgs, max_tokens=N, temperature=0)
    ids, text = generate_reference("What is 2 + 2?", N, chat=True)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == text
    assert r.usage.completion_tokens == len(ids)
    # Streamed: role first, pieces that add up to the same text, usage last, then [DONE].
    chunks = list(c.chat.completions.create(model=server.model_id, messages=msgs, max_tokens=N, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ids)
    with httpx.stream("POST", server.url + "/v1/chat/completions",
                      json={"messages": msgs, "max_tokens": 2, "stream": True}) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert list(sse_events(resp))[-1] == "[DONE]"


def test_32_concurrent_streams_match_generate(server):
    # 4 prompts, 8 requests each, in one burst: the batch mixes prefill and decode rows of
    # different sequences at different positions, and every row must still equal the lone run.
    prompts = [f"Write the number {i} in words:" for i in range(4)]
    refs = {p: tuple(generate_reference(p, N)) for p in prompts}
    c = client(server)

    def stream(i):
        p = prompts[i % len(prompts)]
        ids, text = [], ""
        for ch in c.completions.create(model=server.model_id, prompt=p, max_tokens=N, temperature=0, stream=True,
                                       extra_body={"return_token_ids": True}):
            text += ch.choices[0].text
            ids += ch.choices[0].token_ids or []
        return p, ids, text

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(stream, range(32)))
    assert len(results) == 32
    for p, ids, text in results:
        assert (tuple(ids), text) == (tuple(refs[p][0]), refs[p][1]), p


def test_cancelled_stream_frees_kv_blocks(server):
    body = {"prompt": "Tell me a long story.", "max_tokens": 400, "ignore_eos": True, "stream": True, "temperature": 0}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as resp:
        events = sse_events(resp)
        for _ in range(3):
            next(events)
        m = server.metrics()
        assert m["fdpp_requests_running"] == 1 and m["fdpp_kv_blocks_used"] > 0
    # The client is gone: the request is cancelled and its blocks return by the next step.
    deadline = time.time() + 20
    while time.time() < deadline:
        m = server.metrics()
        if m["fdpp_requests_running"] == 0 and m["fdpp_kv_blocks_used"] == 0:
            break
        time.sleep(0.1)
    assert m["fdpp_requests_running"] == 0 and m["fdpp_kv_blocks_used"] == 0, m
    assert m.get('fdpp_requests_finished_total{finish_reason="cancelled"}', 0) >= 1


BAD = [
    # (path, body (str: sent as is), status, param)
    ("/v1/completions", "{not json", 400, None),
    ("/v1/completions", "[1, 2]", 400, None),
    ("/v1/completions", "[" * 200000, 400, None),  # deep nesting: no stack overflow
    ("/v1/completions", b'{"prompt": "\xff\xfe"}', 400, None),  # invalid UTF-8
    ("/v1/completions", "", 400, None),
    ("/v1/completions", {"max_tokens": 4}, 400, "prompt"),
    ("/v1/chat/completions", {"max_tokens": 4}, 400, "messages"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ("/v1/completions", {"prompt": 42}, 400, "prompt"),
    ("/v1/completions", {"prompt": ["a", []]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "stop_token_ids": [10**6]}, 400, "stop_token_ids"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -5}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10**12}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 100000}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "8"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": [1] * 600, "max_tokens": 4}, 400, "prompt"),
    ("/v1/completions", {"prompt": "word " * 600, "max_tokens": 4}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 10**9]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 2}, 400, "top_p"),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"prompt": "hi", "model": "gpt-4o"}, 404, "model"),
    ("/v1/completions", {"prompt": "hi", "n": 65}, 400, "n"),
    ("/v1/completions", {"prompt": "hi", "best_of": 3}, 400, "best_of"),
    ("/v1/completions", {"prompt": "hi", "n": 2, "best_of": 3}, 400, "best_of"),
    ("/v1/completions", {"prompt": "hi", "echo": True, "logprobs": 1, "stream": True}, 400, "echo"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"1": 101}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"one": 5}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"999999": 5}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "presence_penalty": 2.5}, 400, "presence_penalty"),
    ("/v1/completions", {"prompt": "hi", "frequency_penalty": "high"}, 400, "frequency_penalty"),
    ("/v1/completions", {"prompt": "hi", "prompt_logprobs": 21}, 400, "prompt_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
     400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "echo": True}, 400, "echo"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     400, "tools[0].function"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "json_schema", "json_schema": {
                                  "name": "n", "schema": {"type": "number", "multipleOf": 2}}}}, 400, "response_format"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
     400, "tool_choice"),
    ("/v1/completions", {"prompt": "hi", "min_tokens": 30, "max_tokens": 4}, 400, "min_tokens"),
    ("/v1/completions", {"prompt": "hi", "skip_special_tokens": "no"}, 400, "skip_special_tokens"),
    ("/v1/completions", {"prompt": "hi", "include_stop_str_in_output": True}, 400, "include_stop_str_in_output"),
    ("/v1/completions", {"prompt": "hi", "tools": []}, 400, "tools"),  # chat's field: known, refused
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", "{bad", 400, None),
    ("/detokenize", {"tokens": [10**9]}, 400, "tokens"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {"tokens": "x"}, 400, "tokens"),
    ("/detokenize", {"tokens": [1], "model": "gpt-4o"}, 404, "model"),
]


@pytest.mark.parametrize("path,body,status,param", BAD, ids=[f"{b[3]}-{i}" for i, b in enumerate(BAD)])
def test_bad_request(server, path, body, status, param):
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    r = httpx.post(server.url + path, content=content, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param


def test_unknown_fields_are_ignored_and_named(server):
    # What vLLM and llama-server clients send: the unknown fields are ignored (a warning in the log
    # and a header naming them), the extension fields at their defaults are accepted.
    c = client(server)
    r = c.chat.completions.with_raw_response.create(
        model=server.model_id, messages=[{"role": "user", "content": "What is 2 + 2?"}], max_tokens=N, temperature=0,
        tool_choice="auto", extra_body={"chat_template_kwargs": {"enable_thinking": False, "foo": 1}, "typical_p": 1,
                                        "best_of": 1, "echo": False, "skip_special_tokens": True, "min_tokens": 0})
    # enable_thinking is read (SmolLM2's template has no use for it); the kwargs' other keys are not.
    assert r.headers["x-fdpp-ignored-fields"] == "typical_p,chat_template_kwargs.foo"
    assert r.parse().choices[0].message.content == generate_reference("What is 2 + 2?", N, chat=True)[1]
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1})
    assert r.status_code == 200 and "x-fdpp-ignored-fields" not in r.headers
    log = "".join(server.stderr)
    assert "ignored the unknown fields typical_p,chat_template_kwargs.foo" in log, log
    # The per-request log line: the response's id, its sizes and how it ended.
    rid = r.json()["id"]
    deadline = time.time() + 5
    while f"request {rid}: prompt " not in "".join(server.stderr) and time.time() < deadline:
        time.sleep(0.05)
    assert f"request {rid}: prompt " in "".join(server.stderr)


def test_skip_special_tokens_false_writes_them(server):
    # Past an ignored end of turn the model writes more special tokens: the same ids either way, their
    # text only with skip_special_tokens false (vLLM's meaning).
    body = {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 16, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    skipped, written = (httpx.post(server.url + "/v1/chat/completions", timeout=60,
                                   json={**body, "skip_special_tokens": s}).json()["choices"][0]
                        for s in (True, False))
    assert skipped["token_ids"] == written["token_ids"]
    assert "<|im_end|>" in written["message"]["content"] and "<|im_end|>" not in skipped["message"]["content"]


def test_model_by_id_tokenize_and_detokenize(server):
    c = client(server)
    assert c.models.retrieve(server.model_id).id == server.model_id
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("gpt-4o")
    # /tokenize gives the ids the completion prefills; /detokenize turns them back into the text.
    prompt = "One, two, three, four,"
    ids = c.completions.create(model=server.model_id, prompt=prompt, max_tokens=1,
                               extra_body={"return_token_ids": True}).choices[0].prompt_token_ids
    t = httpx.post(server.url + "/tokenize", json={"prompt": prompt}).json()
    assert t == {"tokens": ids, "count": len(ids), "max_model_len": 512}
    assert httpx.post(server.url + "/detokenize", json={"tokens": ids}).json() == {"prompt": prompt}
    msgs = [{"role": "user", "content": "What is 2 + 2?"}]
    t = httpx.post(server.url + "/tokenize", json={"messages": msgs}).json()
    usage = c.chat.completions.create(model=server.model_id, messages=msgs, max_tokens=1).usage
    assert t["count"] == usage.prompt_tokens


def test_cors(server):
    # A browser's preflight from the allowed origin, then its request: both carry the origin.
    r = httpx.options(server.url + "/v1/chat/completions",
                      headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                               "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"})
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]
    allowed = r.headers["access-control-allow-headers"].lower()
    assert "authorization" in allowed and "content-type" in allowed and "x-stainless-os" in allowed
    r = httpx.get(server.url + "/v1/models", headers={"Origin": ORIGIN})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    # Another origin: refused preflight, and no CORS header on its requests.
    r = httpx.options(server.url + "/v1/completions", headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["message"]
    r = httpx.get(server.url + "/v1/models", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in r.headers


def test_body_limit_and_unknown_route_then_still_serving(server):
    big = b'{"prompt": "' + b"a" * (9 << 20) + b'"}'
    r = httpx.post(server.url + "/v1/completions", content=big, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]
    # Nested 4 million deep, under the body limit: refused while parsing (it crashed the server).
    deep = b'{"prompt": ' + b"[" * 4_000_000 + b"]" * 4_000_000 + b"}"
    r = httpx.post(server.url + "/v1/completions", content=deep, headers={"Content-Type": "application/json"},
                   timeout=60)
    assert r.status_code == 400 and "nests deeper than 64 levels" in r.json()["error"]["message"], r.text
    r = httpx.get(server.url + "/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert httpx.post(server.url + "/v1/embeddings", json={}).status_code == 404
    # A known route under another method: 405 with the method it takes (vLLM's answer), not 404.
    for method, path, allowed in (("GET", "/v1/completions", "POST"), ("PUT", "/v1/chat/completions", "POST"),
                                  ("POST", "/health", "GET"), ("DELETE", "/v1/models/x", "GET")):
        r = httpx.request(method, server.url + path, json={})
        assert r.status_code == 405 and r.headers["allow"] == allowed, (method, path, r.status_code, r.text)
        assert path in r.json()["error"]["message"]
    # A POST with neither a body nor a Content-Length (curl -X POST): httplib refuses it before routing;
    # the error says what is missing.
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), raw
    assert "Content-Length" in json.loads(body)["error"]["message"], raw
    r = client(server).completions.create(model=server.model_id, prompt="Hello", max_tokens=2)
    assert r.usage.completion_tokens >= 1


def test_api_key_and_full_queue():
    # One running sequence and two waiting: a burst of 12 must see 503s.
    s = start("--api-key", "sekret", "--max-num-seqs", "1", "--max-waiting", "2", "--ctx-size", "256",
              "--disable-log-requests", api_key="sekret")
    try:
        # CORS is off by default: no headers, no preflight answered.
        r = httpx.options(s.url + "/v1/models", headers={"Origin": "http://app.example"})
        assert r.status_code != 204 and "access-control-allow-origin" not in r.headers
        assert httpx.post(s.url + "/v1/completions", json={"prompt": "hi"}).status_code == 401
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "hi"}, headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            client(s, api_key="wrong").models.list()
        assert httpx.get(s.url + "/health").status_code == 200  # probes need no key
        auth = {"Authorization": "Bearer sekret"}

        def one(_):
            return httpx.post(s.url + "/v1/completions", headers=auth, timeout=120,
                              json={"prompt": "Count to ten:", "max_tokens": 8, "ignore_eos": True})

        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            results = list(pool.map(one, range(12)))
        codes = [r.status_code for r in results]
        busy = [r for r in results if r.status_code == 503]
        assert codes.count(503) >= 1 and codes.count(200) >= 1 and set(codes) <= {200, 503}, codes
        assert busy and busy[0].headers["Retry-After"] == "1" and busy[0].json()["error"]["code"] == "queue_full"
        r = client(s, api_key="sekret").completions.create(model=s.model_id, prompt="Hello", max_tokens=2)
        assert r.usage.completion_tokens >= 1
        m = s.metrics()
        assert m["fdpp_requests_rejected_queue_full_total"] >= 1 and m["fdpp_requests_waiting"] == 0
        assert "request cmpl-" not in "".join(s.stderr)  # --disable-log-requests
    finally:
        s.stop()


def test_sigterm_while_streaming_finishes_the_stream():
    s = start("--ctx-size", "256")
    events = []
    with httpx.stream("POST", s.url + "/v1/completions", timeout=120,
                      json={"prompt": "Once upon a time", "max_tokens": 12, "ignore_eos": True, "stream": True,
                            "stream_options": {"include_usage": True}}) as resp:
        it = sse_events(resp)
        events.append(next(it))
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        # Draining: new requests are refused, the stream goes on.
        try:
            r = httpx.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=10)
            assert r.status_code == 503
        except httpx.TransportError:
            pass
        events.extend(it)
    assert events[-1] == "[DONE]"
    usage = json.loads(events[-2])["usage"]
    assert usage["completion_tokens"] == 12
    assert s.proc.wait(60) == 0
    assert "stopped" in "".join(s.stderr)


# ---- sampling: logprobs, n, penalties, logit_bias, min_tokens, echo (issue 46) ----------------


def test_chat_logprobs_top_token_is_the_greedy_token(server):
    c = client(server)
    msgs = [{"role": "user", "content": "What is 2 + 2?"}]
    ids, text = generate_reference("What is 2 + 2?", N, chat=True)
    r = c.chat.completions.create(model=server.model_id, messages=msgs, max_tokens=N, temperature=0, logprobs=True,
                                  top_logprobs=3)
    assert r.choices[0].message.content == text  # logprobs change nothing of the output
    content = r.choices[0].logprobs.content
    assert len(content) == len(ids)
    for item in content:
        assert len(item.top_logprobs) == 3
        # The logprobs are the model's (raw logits): at temperature 0 the sampled token is the top one.
        assert item.top_logprobs[0].token == item.token
        assert item.top_logprobs[0].logprob == pytest.approx(item.logprob, abs=1e-6)
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob >= item.top_logprobs[2].logprob
        assert item.logprob <= 0 and item.bytes
    # The tokens' bytes spell the text (up to an end-of-turn token, which the text leaves out).
    spelled = b"".join(bytes(item.bytes) for item in content).decode("utf-8", "replace")
    assert spelled.startswith(text)
    # Streamed: the same entries, spread over the chunks.
    streamed = []
    for chunk in c.chat.completions.create(model=server.model_id, messages=msgs, max_tokens=N, temperature=0,
                                           logprobs=True, top_logprobs=3, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content
    assert [(x.token, round(x.logprob, 5)) for x in streamed] == [(x.token, round(x.logprob, 5)) for x in content]
    # logprobs without top_logprobs: the sampled token's alone.
    r = c.chat.completions.create(model=server.model_id, messages=msgs, max_tokens=2, temperature=0, logprobs=True)
    assert [x.top_logprobs for x in r.choices[0].logprobs.content] == [[], []]
    assert r.choices[0].logprobs.content[0].logprob == pytest.approx(content[0].logprob, abs=1e-5)


def test_completion_logprobs_and_echo(server):
    c = client(server)
    prompt = "The capital of France is"
    ids, text = generate_reference(prompt, N)
    r = c.completions.create(model=server.model_id, prompt=prompt, max_tokens=N, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == len(ids)
    for tok, p, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) <= 2 and max(top, key=top.get) == tok and top[tok] == pytest.approx(p, abs=1e-6)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert "".join(lp.tokens).startswith(text)
    # echo: the prompt in front of the text; streamed, it comes first.
    r = c.completions.create(model=server.model_id, prompt=prompt, max_tokens=N, temperature=0, echo=True)
    assert r.choices[0].text == prompt + text
    pieces = [ch.choices[0].text for ch in c.completions.create(model=server.model_id, prompt=prompt, max_tokens=N,
                                                                temperature=0, echo=True, stream=True) if ch.choices]
    assert pieces[0] == prompt and "".join(pieces) == prompt + text


def test_echo_with_logprobs_scores_the_prompt(server):
    # lm-evaluation-harness's loglikelihood request: the context and continuation as the prompt,
    # echo, logprobs 1, max_tokens 1. Every prompt token after the first gets the log probability the
    # model gives it; a greedy continuation's tokens score as they did when they were generated.
    c = client(server)
    prompt = "The capital of France is"
    ids, _ = generate_reference(prompt, N)
    gen = c.completions.create(model=server.model_id, prompt=prompt, max_tokens=N, temperature=0, logprobs=1,
                               extra_body={"return_token_ids": True})
    prompt_ids = gen.choices[0].prompt_token_ids
    scored_ids = prompt_ids + ids[:3]
    r = c.completions.create(model=server.model_id, prompt=scored_ids, max_tokens=1, temperature=0, logprobs=1,
                             echo=True)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(scored_ids) + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(p <= 0 for p in lp.token_logprobs[1:])
    n = len(prompt_ids)
    assert lp.token_logprobs[n:n + 3] == pytest.approx(gen.choices[0].logprobs.token_logprobs[:3], abs=1e-4)
    # The continuation is greedy: each of its tokens is its position's most likely one.
    for i in range(n, n + 3):
        top = lp.top_logprobs[i]
        assert max(top, key=top.get) == lp.tokens[i]
    # As the harness sends them: a batch of token-id prompts, each scored on its own.
    body = {"model": server.model_id, "prompt": [scored_ids, prompt_ids], "temperature": 0, "max_tokens": 1,
            "logprobs": 1, "seed": 1234, "echo": True}
    out = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    first, second = sorted(out["choices"], key=lambda ch: ch["index"])
    assert first["logprobs"]["token_logprobs"][:-1] == pytest.approx([None] + lp.token_logprobs[1:-1], abs=1e-5)
    assert len(second["logprobs"]["token_logprobs"]) == n + 1
    assert second["logprobs"]["token_logprobs"][1:n] == pytest.approx(lp.token_logprobs[1:n], abs=1e-5)


def test_vllm_prompt_logprobs(server):
    # vLLM's prompt_logprobs field: per prompt token after the first, {id: {logprob, rank,
    # decoded_token}} with the top k beside it; the same scores as echo with logprobs. Chat answers
    # it once beside the choices.
    c = client(server)
    ids = [int(i) for i in httpx.post(server.url + "/tokenize", json={"model": server.model_id,
                                      "prompt": "The capital of France is"}, timeout=60).json()["tokens"]]
    echo = c.completions.create(model=server.model_id, prompt=ids, max_tokens=1, temperature=0, logprobs=2,
                                echo=True).choices[0].logprobs
    r = c.completions.create(model=server.model_id, prompt=ids, max_tokens=1, temperature=0,
                             extra_body={"prompt_logprobs": 2})
    plp = r.choices[0].model_extra["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    for i in range(1, len(ids)):
        own = plp[i][str(ids[i])]
        assert own["logprob"] == pytest.approx(echo.token_logprobs[i], abs=1e-5)
        assert own["rank"] >= 1 and isinstance(own["decoded_token"], str)
        ranks = sorted(v["rank"] for k, v in plp[i].items() if k != str(ids[i]) or v["rank"] <= 2)
        assert set(range(1, 3)) <= set(ranks) | {own["rank"]}, plp[i]
        assert 2 <= len(plp[i]) <= 3
    # n = 2: the prompt is scored once and each choice carries the scores; so does echo's.
    two = c.completions.create(model=server.model_id, prompt=ids, max_tokens=2, temperature=1.0, n=2, seed=5,
                               logprobs=2, echo=True, extra_body={"prompt_logprobs": 2})
    assert len(two.choices) == 2
    for choice in two.choices:
        assert choice.model_extra["prompt_logprobs"] == plp
        assert choice.logprobs.token_logprobs[1:len(ids)] == pytest.approx(echo.token_logprobs[1:len(ids)], abs=1e-5)
    chat = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": server.model_id, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
        "prompt_logprobs": 0}).json()
    assert chat["prompt_logprobs"][0] is None and len(chat["prompt_logprobs"]) > 2, chat
    assert all(len(p) == 1 for p in chat["prompt_logprobs"][1:])
    streamed = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "model": server.model_id, "prompt": "a", "prompt_logprobs": 1, "stream": True})
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "prompt_logprobs"


def test_n_choices(server):
    c = client(server)
    prompt = "Once upon a time"
    one = c.completions.create(model=server.model_id, prompt=prompt, max_tokens=N, temperature=0)
    # Greedy: n identical choices, the prompt counted once in the usage.
    r = c.completions.create(model=server.model_id, prompt=prompt, max_tokens=N, temperature=0, n=3)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert [ch.text for ch in r.choices] == [one.choices[0].text] * 3
    assert r.usage.prompt_tokens == one.usage.prompt_tokens
    assert r.usage.completion_tokens == 3 * one.usage.completion_tokens
    # Sampled: distinct choices, and a seed makes them repeat; choice 0 is the n = 1 request's.
    kw = dict(model=server.model_id, prompt=prompt, max_tokens=12, temperature=1.0, seed=11)
    a = c.completions.create(n=3, **kw)
    b = c.completions.create(n=3, best_of=3, **kw)
    texts = [ch.text for ch in a.choices]
    assert len(set(texts)) == 3, texts
    assert texts == [ch.text for ch in b.choices]
    assert texts[0] == c.completions.create(**kw).choices[0].text
    # Chat, and streamed: the chunks of each choice carry its index.
    msgs = [{"role": "user", "content": "Tell me a story."}]
    r = c.chat.completions.create(model=server.model_id, messages=msgs, max_tokens=10, temperature=1.0, n=3)
    assert len(r.choices) == 3 and len({ch.message.content for ch in r.choices}) == 3
    streamed, finishes, roles = ["", "", ""], [0, 0, 0], [[], [], []]
    for chunk in c.chat.completions.create(model=server.model_id, messages=msgs, max_tokens=10, temperature=1.0, n=3,
                                           stream=True):
        for ch in chunk.choices:
            streamed[ch.index] += ch.delta.content or ""
            finishes[ch.index] += ch.finish_reason is not None
            if ch.delta.role:
                roles[ch.index].append(ch.delta.role)
    assert finishes == [1, 1, 1] and len(set(streamed)) == 3
    assert roles == [["assistant"]] * 3  # each choice's first chunk names the role


def test_penalties_logit_bias_and_min_tokens_change_the_output(server):
    c = client(server)
    prompt = "la la la la la la la la la la"
    base = dict(model=server.model_id, prompt=prompt, max_tokens=16, temperature=0,
                extra_body={"return_token_ids": True})
    greedy = c.completions.create(**base).choices[0]
    # OpenAI's penalties over the generated tokens: a repetitive greedy output changes and repeats less.
    for field in ("presence_penalty", "frequency_penalty"):
        pen = c.completions.create(**base, **{field: 2.0}).choices[0]
        assert pen.token_ids != greedy.token_ids, field
        assert len(set(pen.token_ids)) > len(set(greedy.token_ids)), (field, pen.text, greedy.text)
    # logit_bias: the greedy first token banned, another forced.
    first = greedy.token_ids[0]
    r = c.completions.create(**base, logit_bias={str(first): -100}).choices[0]
    assert first not in r.token_ids
    forced = greedy.token_ids[0] + 1
    r = c.completions.create(**base, logit_bias={str(forced): 100}).choices[0]
    assert r.token_ids == [forced] * 16
    # min_tokens: a chat answer that ends early goes on to at least min_tokens tokens.
    msgs = [{"role": "user", "content": "Say OK."}]
    short = c.chat.completions.create(model=server.model_id, messages=msgs, max_tokens=64, temperature=0)
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 30
    want = short.usage.completion_tokens + 5
    long = c.chat.completions.create(model=server.model_id, messages=msgs, max_tokens=64, temperature=0,
                                     extra_body={"min_tokens": want})
    assert long.usage.completion_tokens >= want


def test_multi_turn_chat_reuses_the_prefix_cache(server):
    # A chat resends the whole conversation each turn: the second turn finds the first turn's blocks
    # in the KV cache (usage.prompt_tokens_details.cached_tokens > 0), and answers exactly what a
    # server with --no-prefix-cache answers.
    off = start("--ctx-size", "512", "--no-prefix-cache")
    try:
        system = {"role": "system", "content": "You are a terse assistant. Answer every question with one short "
                                               "sentence and nothing else."}

        def converse(s):
            c = client(s)
            msgs = [system, {"role": "user", "content": "Name a primary color."}]
            first = c.chat.completions.create(model=s.model_id, messages=msgs, max_tokens=N, temperature=0)
            msgs += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "Name another one."}]
            second = c.chat.completions.create(model=s.model_id, messages=msgs, max_tokens=N, temperature=0)
            chunks = list(c.chat.completions.create(model=s.model_id, messages=msgs, max_tokens=N, temperature=0,
                                                    stream=True, stream_options={"include_usage": True}))
            streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            return first, second, streamed, chunks[-1].usage

        first_on, second_on, streamed_on, usage_on = converse(server)
        first_off, second_off, streamed_off, usage_off = converse(off)
        assert first_on.choices[0].message.content == first_off.choices[0].message.content
        assert second_on.choices[0].message.content == second_off.choices[0].message.content
        assert streamed_on == streamed_off == second_off.choices[0].message.content
        cached = second_on.usage.prompt_tokens_details.cached_tokens
        assert 0 < cached < second_on.usage.prompt_tokens
        assert cached % 16 == 0  # whole KV blocks
        assert usage_on.prompt_tokens_details.cached_tokens >= cached  # the streamed repeat finds even more
        assert second_off.usage.prompt_tokens_details.cached_tokens == 0
        assert usage_off.prompt_tokens_details.cached_tokens == 0
        m_on, m_off = server.metrics(), off.metrics()
        assert m_on["fdpp_prefix_cache_hits_total"] >= cached + usage_on.prompt_tokens_details.cached_tokens
        assert 0 < m_on["fdpp_prefix_cache_hit_rate"] <= 1
        assert m_on["fdpp_prefix_cache_queries_total"] >= m_on["fdpp_prefix_cache_hits_total"]
        assert m_off["fdpp_prefix_cache_queries_total"] == 0 and m_off["fdpp_prefix_cache_hits_total"] == 0
        assert "fdpp_prefix_cache_evictions_total" in m_on
    finally:
        off.stop()


@pytest.mark.parametrize("model", ["hf/qwen3moe_tied_gguf/model.gguf", "hf/mixtral_gqa_bf16"])
def test_mixture_of_experts_models_serve_like_any_other(model):
    # A Qwen3-MoE GGUF and a Mixtral directory (tiny random checkpoints written by transformers, see
    # tests/fixtures/hf): the greedy continuation of the fixture's prompt ids is transformers' own,
    # through the OpenAI client, and a chat through the model's template streams.
    fixture = os.path.join(ROOT, "tests", "fixtures", model)
    ref_dir = os.path.dirname(fixture) if fixture.endswith(".gguf") else fixture
    with open(os.path.join(ref_dir, "reference.json")) as f:
        ref = json.load(f)
    s = start("--model", fixture, "--ctx-size", "128")
    try:
        c = client(s)
        r = c.completions.create(model=s.model_id, prompt=ref["prompt"], max_tokens=len(ref["greedy"]), temperature=0,
                                 extra_body={"return_token_ids": True, "ignore_eos": True})
        assert r.choices[0].token_ids == ref["greedy"]
        chunks = list(c.chat.completions.create(model=s.model_id, messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=4, temperature=0, stream=True,
                                                extra_body={"ignore_eos": True}))
        assert chunks[-1].choices[0].finish_reason == "length"
    finally:
        s.stop()
