"""`pip install <repository>` into a fresh virtual environment gives a working package.

This builds the extension (incrementally: pyproject.toml keeps the build folder in build-python/),
so it takes a minute or more; FDPP_TEST_INSTALL=0 skips it for quick local runs (never in CI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import fdpp

from conftest import IN_CI, ROOT


@pytest.mark.skipif(os.environ.get("FDPP_TEST_INSTALL", "1") == "0" and not IN_CI,
                    reason="FDPP_TEST_INSTALL=0")
def test_pip_install_into_a_fresh_venv(tmp_path, llm):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    cuda = "ON" if os.environ.get("FDPP_PYTHON_CUDA", "OFF") == "ON" else "OFF"
    p = subprocess.run([py, "-m", "pip", "install", "-q", str(ROOT), f"--config-settings=cmake.define.FDPP_CUDA={cuda}"],
                       capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    # Run from tmp_path so that `import fdpp` cannot pick up the checkout's python/ folder.
    script = textwrap.dedent("""
        import json, fdpp
        llm = fdpp.LLM(device="cpu", max_model_len=256)
        out = llm.generate("The capital of France is", fdpp.SamplingParams(temperature=0, max_tokens=4))
        print(json.dumps({"file": fdpp.__file__, "ids": out[0].token_ids}))
    """)
    p = subprocess.run([py, "-c", script], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["file"].startswith(str(venv))
    want = llm.generate("The capital of France is", fdpp.SamplingParams(temperature=0, max_tokens=4))[0].token_ids
    if llm.device == "cpu":
        assert got["ids"] == want
