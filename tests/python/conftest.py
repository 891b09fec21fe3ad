"""Shared fixtures of the Python package tests (pytest tests/python; scripts/test-python.sh in CI).

FDPP_TEST_DEVICE picks the device (cpu by default; cuda runs the same tests on the GPU and skips
them where there is none). FDPP_BIN names the CLI the results are compared with (default:
build/fdpp of this checkout). Under CI (CI=true) a missing CLI or default model fails the run
instead of skipping, so that a green CI always means the comparisons ran.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import fdpp

ROOT = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
DEVICE = os.environ.get("FDPP_TEST_DEVICE", "cpu")


def skip_or_fail(reason: str) -> None:
    if IN_CI:
        pytest.fail(reason + " (CI=true: required)")
    pytest.skip(reason)


def gpu_available() -> bool:
    if not fdpp.cuda_built:
        return False
    # A tiny HF fixture, so that the probe needs no default model (the GPU machine may lack it).
    probe = ROOT / "tests" / "fixtures" / "hf" / "llama_gqa_hd128_f16"
    try:
        fdpp.LLM(str(probe), device="cuda", max_num_seqs=1, kv_cache_tokens=128, max_model_len=128)
    except fdpp.InvalidInputError:
        return False
    return True


@pytest.fixture(scope="session")
def device() -> str:
    if DEVICE == "cuda" and not gpu_available():
        pytest.skip("FDPP_TEST_DEVICE=cuda: no usable GPU (or fdpp built without CUDA)")
    return DEVICE


@pytest.fixture(scope="session")
def default_model() -> str:
    path = fdpp.default_model_path()
    if not os.path.exists(path):
        skip_or_fail(f"the default model {path} is missing (bash scripts/fetch-default-model.sh)")
    return path


@pytest.fixture(scope="session")
def llm(default_model: str, device: str) -> fdpp.LLM:
    # A context of 512 keeps the CPU cache small; every test prompt fits in it. The KV cache is
    # sized explicitly: on the GPU the default takes all free memory but 512 MiB, and the tests load
    # more models beside this one.
    return fdpp.LLM(default_model, device=device, max_model_len=512, max_num_seqs=32, kv_cache_tokens=32 * 512)


@pytest.fixture(scope="session")
def fdpp_bin() -> str:
    path = os.environ.get("FDPP_BIN") or str(ROOT / "build" / "fdpp")
    if not os.access(path, os.X_OK):
        skip_or_fail(f"the fdpp CLI {path} is missing (bash scripts/build.sh, or set FDPP_BIN)")
    return path


class Cli:
    """Runs the CLI on the same model and device as the tests."""

    def __init__(self, binary: str, model: str, device: str) -> None:
        self.binary, self.model, self.device = binary, model, device

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run([self.binary, *args], capture_output=True, text=True, timeout=600)
        if check and p.returncode != 0:
            raise AssertionError(f"fdpp {' '.join(args)} failed ({p.returncode}): {p.stderr.strip()}")
        return p

    def generate(self, *args: str) -> dict:
        p = self.run("generate", "--model", self.model, "--device", self.device, "--json", *args)
        return json.loads(p.stdout)

    def logits(self, ids: list[int], out: Path, model: str | None = None) -> np.ndarray:
        self.run("logits", "--model", model or self.model, "--device", self.device,
                 "--token-ids", ",".join(map(str, ids)), "--out", str(out))
        return np.load(out)

    def error(self, *args: str) -> str:
        """The one-line message of a failing command, without the "fdpp: error: " prefix."""
        p = self.run(*args, check=False)
        assert p.returncode == 1, f"fdpp {' '.join(args)} exited {p.returncode}: {p.stderr}"
        line = p.stderr.strip().splitlines()[-1]
        assert line.startswith("fdpp: error: "), line
        return line[len("fdpp: error: "):]


@pytest.fixture(scope="session")
def cli(fdpp_bin: str, default_model: str, device: str) -> Cli:
    return Cli(fdpp_bin, default_model, device)
