"""The fdpp binary (FDPP_BIN, else build/fdpp) and the default model for the CLI tests."""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FDPP = os.environ.get("FDPP_BIN", os.path.join(ROOT, "build", "fdpp"))


def run(*args, stdin=subprocess.DEVNULL, timeout=300):
    """Runs fdpp with args; returns the CompletedProcess (text)."""
    return subprocess.run([FDPP, *args], stdin=stdin, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def default_model():
    """The default model's path; the tests that run a model skip without it."""
    r = run("info", "--json", "--device", "cpu")
    if r.returncode != 0:
        pytest.skip(f"no default model: {r.stderr.strip()}")
    import json

    return json.loads(r.stdout)["path"]
