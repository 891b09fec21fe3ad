#!/usr/bin/env python3
"""Host memory of the front ends that serve a model (issue 39): `fdpp serve` and `fdpp.LLM` load a
checkpoint as the CLI does (weights streamed from the files to the GPU), so their peak RSS stays
near the staging ring whatever the model's size. Measures, for one HF checkpoint directory:

  serve:   seconds until /health answers 200, peak RSS (VmHWM) then, RSS (VmRSS) after a request
  python:  seconds for fdpp.LLM(dir), peak RSS (ru_maxrss) after it and after one generate

  load_rss.py DIR --fdpp BIN [--port 8093] [--json FILE]

The directory needs tokenizer files (serve takes text): bench/load_bench.py makes the weights, and
the caller copies a tokenizer in (tests/fixtures/hf/tokenizers/spm_llama for Llama-2's 32000 ids).
"""
import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request


def status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def measure_serve(d, fdpp, port):
    t0 = time.time()
    p = subprocess.Popen([fdpp, "serve", "--model", d, "--port", str(port), "--max-num-seqs", "8"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    healthy = None
    try:
        while time.time() - t0 < 300 and p.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        healthy = time.time() - t0
                        break
            except Exception:
                pass
            time.sleep(0.05)
        if healthy is None:
            raise SystemExit(f"serve did not become healthy: {p.stderr.read() if p.poll() is not None else 'timeout'}")
        peak_loaded = status_kib(p.pid, "VmHWM")
        body = json.dumps({"prompt": [1, 2, 3, 4], "max_tokens": 16, "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            completion = json.load(r)
        return {"front_end": "serve", "seconds_to_healthy": healthy, "peak_rss_gib": peak_loaded / 2**20,
                "rss_after_request_gib": status_kib(p.pid, "VmRSS") / 2**20,
                "peak_rss_after_request_gib": status_kib(p.pid, "VmHWM") / 2**20,
                "completion_tokens": completion["usage"]["completion_tokens"]}
    finally:
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


PY_CHILD = r"""
import json, resource, sys, time
import fdpp
t0 = time.time()
llm = fdpp.LLM(sys.argv[1], max_num_seqs=8)
loaded = time.time() - t0
peak_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = llm.generate([[1, 2, 3, 4]], fdpp.SamplingParams(temperature=0, max_tokens=16))
logits = llm.logits([1, 2, 3, 4])
print(json.dumps({"front_end": "python", "seconds_to_load": loaded, "peak_rss_gib": peak_loaded / 2**20,
                  "peak_rss_after_generate_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                  "generated_tokens": len(out[0].token_ids), "logits_shape": list(logits.shape),
                  "device": llm.device}))
"""


def measure_python(d):
    r = subprocess.run([sys.executable, "-c", PY_CHILD, d], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"python front end failed: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--fdpp", required=True)
    ap.add_argument("--port", type=int, default=8093)
    ap.add_argument("--json")
    ap.add_argument("--skip-python", action="store_true")
    a = ap.parse_args()
    size = sum(os.path.getsize(os.path.join(a.dir, f)) for f in os.listdir(a.dir) if f.endswith(".safetensors"))
    rows = [measure_serve(a.dir, a.fdpp, a.port)]
    if not a.skip_python:
        rows.append(measure_python(a.dir))
    print(f"checkpoint {a.dir}: {size / 1e9:.2f} GB of safetensors")
    print("| front end | seconds to ready | peak RSS GiB (loaded) | peak RSS GiB (after a request) |")
    print("| --- | ---: | ---: | ---: |")
    for r in rows:
        ready = r.get("seconds_to_healthy", r.get("seconds_to_load"))
        after = r.get("peak_rss_after_request_gib", r.get("peak_rss_after_generate_gib"))
        print(f"| {r['front_end']} | {ready:.2f} | {r['peak_rss_gib']:.2f} | {after:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
