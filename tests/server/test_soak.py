"""fdpp serve under load on the CPU with the default model, bounded in time: a soak of 2,000 short
requests from 64 concurrent clients with random cancels (every request finishes or is cancelled, the
KV blocks all come back, host memory does not grow), and preemption under KV pressure (every request
completes, and its greedy output equals `fdpp generate`'s)."""
import concurrent.futures
import random
import time

import httpx

from conftest import start
from test_server import generate_reference, sse_events

SOAK_REQUESTS = 2000
SOAK_CLIENTS = 64
SOAK_EARLY = 200  # RSS is compared with its value after this many requests


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def wait_drained(server, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = server.metrics()
        if m["fdpp_requests_running"] == 0 and m["fdpp_requests_waiting"] == 0 and m["fdpp_kv_blocks_used"] == 0:
            return m
        time.sleep(0.1)
    raise AssertionError(f"the server did not drain: {m}")


def test_soak_2000_requests_64_clients_with_cancels():
    # The prefix cache keeps finished requests' blocks until the KV pool is full (by design: its
    # memory is committed as blocks are first used), so the pool is small enough (64 blocks, what
    # the first burst of 64 requests takes) to be all in use from the start: host memory growing
    # after SOAK_EARLY requests is then a leak. The full pool keeps the cache evicting and the
    # scheduler preempting under load.
    server = start("--max-num-seqs", "64", "--ctx-size", "256", "--kv-cache-tokens", "1024")
    try:
        words = ["red", "blue", "seven", "river", "stone", "light", "quick", "cold", "north", "song"]
        done = {"finished": 0, "cancelled": 0}
        counter = iter(range(SOAK_REQUESTS))
        early_rss = []

        def one(http, rng, i):
            prompt = " ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
            body = {"model": server.model_id, "prompt": prompt, "max_tokens": rng.randint(1, 6), "temperature":
                    rng.choice([0, 0.8]), "seed": i, "ignore_eos": rng.random() < 0.5}
            kind = rng.random()
            if kind < 0.15:
                # A client that goes away after the first event: the server cancels the request.
                body.update(max_tokens=64, ignore_eos=True, stream=True)
                with http.stream("POST", "/v1/completions", json=body) as r:
                    assert r.status_code == 200, r.read()
                    next(sse_events(r))
                return "cancelled"
            if kind < 0.5:
                body["stream"] = True
                with http.stream("POST", "/v1/completions", json=body) as r:
                    assert r.status_code == 200, r.read()
                    events = list(sse_events(r))
                assert events[-1] == "[DONE]", events[-3:]
                return "finished"
            r = http.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] in ("length", "stop"), choice
            return "finished"

        def client(seed):
            rng = random.Random(seed)
            with httpx.Client(base_url=server.url, timeout=120) as http:
                outcomes = []
                for i in counter:  # shared: the clients together send SOAK_REQUESTS requests
                    outcomes.append(one(http, rng, i))
                    if i == SOAK_EARLY:
                        early_rss.append(rss_bytes(server.proc.pid))
                return outcomes

        with concurrent.futures.ThreadPoolExecutor(SOAK_CLIENTS) as pool:
            for outcomes in pool.map(client, range(SOAK_CLIENTS)):
                for o in outcomes:
                    done[o] += 1
        assert done["finished"] + done["cancelled"] == SOAK_REQUESTS, done
        m = wait_drained(server)
        finished = sum(v for k, v in m.items() if k.startswith("fdpp_requests_finished_total"))
        assert finished == SOAK_REQUESTS, (finished, done)
        assert m.get('fdpp_requests_finished_total{finish_reason="error"}', 0) == 0, m
        assert m["fdpp_kv_blocks_free"] > 0
        assert m["fdpp_prefix_cache_evictions_total"] > 0, m
        late = rss_bytes(server.proc.pid)
        assert early_rss and late <= 1.10 * early_rss[0], (early_rss, late)
        assert server.proc.poll() is None
    finally:
        server.stop()


def test_preemption_under_kv_pressure_outputs_equal_generate():
    # 16 running requests of about 40 tokens each in a cache of 256 tokens: the scheduler must preempt
    # and recompute, and greedy outputs must not change.
    server = start("--max-num-seqs", "16", "--ctx-size", "256", "--kv-cache-tokens", "256")
    try:
        prompts = [f"List {w} things you can see at the beach:" for w in ("two", "three", "four", "five")]
        n = 24
        refs = {p: generate_reference(p, n) for p in prompts}

        def one(i):
            p = prompts[i % len(prompts)]
            r = httpx.post(server.url + "/v1/completions", timeout=300, json={
                "model": server.model_id, "prompt": p, "max_tokens": n, "temperature": 0, "return_token_ids": True})
            assert r.status_code == 200, r.text
            c = r.json()["choices"][0]
            return p, c["token_ids"], c["text"]

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(one, range(16)))
        m = wait_drained(server)
        assert m["fdpp_preemptions_total"] > 0, m
        for p, ids, text in results:
            assert (ids, text) == (refs[p][0], refs[p][1]), p
    finally:
        server.stop()
