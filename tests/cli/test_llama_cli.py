"""The CLI as llama.cpp users type it, through the real binary: the multi-letter flag table (each
row's outcome: taken with its meaning, ignored with a note, or refused by its name), -e escape
processing, --help's groups and width, fdpp info's runs-as / chat template / end tokens, and
fdpp bench's advice on a machine without a GPU. The table's every row is checked in
tests/test_llama_flags.cpp; here a row of each kind goes through main."""
import json
import os
import re

import pytest

from conftest import run

GEN = ["generate", "--device", "cpu", "--temp", "0", "-n", "1", "--quiet"]


# (flags, outcome): "ok" runs; "note:<text>" runs with that note on stderr; "refused:<text>" exits 2
# with one line naming the flag. Refusals happen before any model is opened.
TABLE = [
    (["-ngl", "99"], "note:-ngl 99: no GPU is used here"),
    (["-ngl", "all"], "note:-ngl 999:"),
    (["-fa", "on"], "note:-fa on: ignored: fdpp's attention kernels are always fused"),
    (["-fa"], "note:-fa: ignored"),
    (["-ctk", "f16", "-ctv", "bf16"], "note:-ctv bf16: ignored: the KV cache takes"),
    (["-nkvo"], "note:-nkvo: ignored"),
    (["-sm", "none"], "note:-sm none: ignored"),
    (["-ts", "1"], "note:-ts 1: ignored"),
    (["-mg", "0"], "note:-mg 0: ignored"),
    (["-tb", "2"], "note:-tb 2: ignored"),
    (["-ub", "512"], "note:-ub 512: ignored"),
    (["-cb"], "note:-cb: ignored: continuous batching is always on"),
    (["-dev", "none"], "ok"),
    (["-np", "2"], "ok"),
    (["-sys", "Be brief."], "ok"),
    (["-no-cnv"], "ok"),
    (["-ctk", "q8_0"], "refused:-ctk q8_0 (--cache-type-k): quantized KV caches are not supported"),
    (["-dev", "CUDA0,CUDA1"], "refused:-dev CUDA0,CUDA1 (--device): one model over several GPUs"),
    (["-mg", "1"], "refused:-mg 1 (--main-gpu):"),
    (["-hf", "org/model"], "refused:-hf org/model (--hf-repo): fdpp downloads nothing"),
    (["-md", "draft.gguf"], "refused:-md draft.gguf (--model-draft): speculative decoding"),
    (["-ot", "exps=CPU"], "refused:-ot exps=CPU (--override-tensor):"),
    (["-cmoe"], "refused:-cmoe (--cpu-moe):"),
    (["-xyz"], "refused:-xyz: not a flag here"),
    (["-ngl"], "refused:-ngl (--n-gpu-layers): needs a value"),
]


@pytest.mark.parametrize("flags,outcome", TABLE, ids=[" ".join(f) for f, _ in TABLE])
def test_llama_cpp_flag(flags, outcome):
    kind, _, text = outcome.partition(":")
    if kind == "refused":
        r = run(*GEN, "-p", "hi", *flags)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("fdpp: error: " + text), r.stderr
        return
    if not os.environ.get("FDPP_MODEL") and run("info", "--device", "cpu").returncode != 0:
        pytest.skip("no default model")
    base = [a for a in GEN if a not in ("--device", "cpu")] if "-dev" in flags else GEN  # -dev is the device
    r = run(*base, "-p", "hi", *flags)
    assert r.returncode == 0, r.stderr
    if kind == "note":
        assert any(line.startswith("fdpp: " + text) for line in r.stderr.splitlines()), r.stderr


def test_cnv_is_not_a_short_flag_cluster():
    # Before the table, "-cnv" read as "-c nv": "--ctx-size: 'nv' is not an integer".
    r = run("generate", "-cnv", "--json")
    assert "ctx-size" not in r.stderr and "--json: not with the chat" in r.stderr


def test_serve_refuses_a_generate_only_flag_by_its_name():
    r = run("serve", "-cnv")
    assert r.returncode == 2
    assert r.stderr.strip() == "fdpp: error: -cnv (--conversation): not a flag of this subcommand"


def prompt_ids(default_model, *args):
    r = run(*GEN, "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["prompt_token_ids"]


def test_escapes_are_processed_by_default_as_in_llama_cpp(default_model):
    escaped = prompt_ids(default_model, "-p", r"tab\there\nnew line \x41\\")
    literal = prompt_ids(default_model, "-p", "tab\there\nnew line A\\")
    assert escaped == literal
    assert prompt_ids(default_model, "-e", "-p", r"a\tb") == prompt_ids(default_model, "-p", "a\tb")
    # --no-escape keeps the backslashes.
    assert prompt_ids(default_model, "--no-escape", "-p", r"a\tb") != prompt_ids(default_model, "-p", "a\tb")
    assert prompt_ids(default_model, "--no-escape", "-p", r"a\tb") == prompt_ids(default_model, "-p", r"a\\tb")


def subcommands():
    r = run("--help")
    assert r.returncode == 0
    section = r.stdout.split("Subcommands:", 1)[1]
    return [m.group(1) for m in re.finditer(r"^  (\S+)", section, re.M)]


def test_help_fits_100_columns_everywhere():
    names = subcommands()
    assert {"generate", "serve", "info", "bench"} <= set(names)
    for args in [["--help"]] + [[name, "--help"] for name in names]:
        r = run(*args)
        assert r.returncode == 0, (args, r.stderr)
        for line in r.stdout.splitlines():
            assert len(line) <= 100, f"fdpp {' '.join(args)}: {len(line)} columns: {line!r}"


def test_generate_help_is_grouped_by_topic():
    out = run("generate", "--help").stdout
    groups = re.findall(r"^(\S[^:\n]*):$", out, re.M)
    for g in ["Prompt", "Chat (-cnv, -i)", "Sampling", "Output", "Model", "Devices"]:
        assert g in groups, (g, groups)
    # Each flag is listed under its topic.
    chat = out.split("Chat (-cnv, -i):", 1)[1].split("\n\n", 1)[0]
    assert "--interactive" in chat and "--multiline-input" in chat and "--top-k" not in chat


def test_info_shows_how_the_weights_run_the_template_and_the_end_tokens(default_model):
    r = run("info", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^runs as: +cpu: F32 x\d+ -> f32, Q4_1 x\d+ -> Q4_1 in place, .*8-bit activations", r.stdout, re.M), r.stdout
    assert re.search(r"^chat: +ChatML template \(GGUF tokenizer.chat_template\)$", r.stdout, re.M), r.stdout
    assert re.search(r"^end tokens: +.*<\|im_end\|> \(2\)", r.stdout, re.M), r.stdout
    j = json.loads(run("info", "--json", "--device", "cuda", "--dtype", "bf16").stdout)
    assert j["runs_as"]["device"] == "cuda"
    # The GGUF's layer matrices (all Q4_1) stay in their blocks on the GPU; the rest (F32 norms, the
    # Q8_0 embeddings) is converted to --dtype.
    assert {w["stored"]: w["runs_as"] for w in j["runs_as"]["weights"]} == {
        "F32": "bf16", "Q4_1": "Q4_1 in place", "Q8_0": "bf16"}
    assert 0 < j["cuda_weight_bytes"] < 2 * j["stored_bytes"]
    assert j["chat_template"] == {"name": "ChatML", "source": "GGUF tokenizer.chat_template"}
    assert {"id": 2, "text": "<|im_end|>"} in j["eos_tokens"]
    f32 = json.loads(run("info", "--json", "--device", "cpu", "--cpu-weights", "f32").stdout)
    assert {w["runs_as"] for w in f32["runs_as"]["weights"]} == {"f32"}


def test_bench_takes_llama_bench_habits(default_model):
    r = run("bench", "--device", "cpu", "-ngl", "99", "-fa", "1", "-p", "16", "-n", "4", "-r", "1")
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stderr.splitlines() if line.startswith("fdpp: -")]
    assert notes == ["fdpp: -ngl 99: ignored: every layer runs on the device that runs the model",
                     "fdpp: -fa 1: ignored: fdpp's attention kernels are always fused (flash) ones"], r.stderr
    assert re.search(r"^\| .* \| pp16 \| ", r.stdout, re.M) and re.search(r"^\| .* \| tg4 \| ", r.stdout, re.M), r.stdout


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="a GPU is present: bench would run")
def test_bench_without_a_gpu_suggests_the_cpu():
    if "cuda" not in run("bench", "--help").stdout:
        pytest.skip("a CPU-only build: bench is the CPU's")
    r = run("bench", "--load-format", "dummy", "--config", "nonexistent.json", "-b", "1", "-c", "64")
    assert r.returncode == 1
    assert "no usable GPU" in r.stderr and "--device cpu" in r.stderr, r.stderr
