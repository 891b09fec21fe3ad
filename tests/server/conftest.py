"""Starts `fdpp serve` processes for the tests: 127.0.0.1, a free port (--port 0; the port is read
from the server's first line on stderr), the default model on the CPU."""
import os
import re
import signal
import subprocess
import threading
import time

import httpx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORIGIN = "http://app.example:3000"  # the page origin the module's server allows
FDPP = os.environ.get("FDPP_BIN", os.path.join(ROOT, "build", "fdpp"))


class Server:
    def __init__(self, *args):
        self.args = [FDPP, "serve", "--device", "cpu", "--host", "127.0.0.1", "--port", "0", *args]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.stderr = []
        port = []
        listening = threading.Event()

        def read():  # drains stderr so the server never blocks on a full pipe
            for line in self.proc.stderr:
                self.stderr.append(line)
                m = re.search(r"listening on http://[^:]+:(\d+)", line)
                if m and not port:
                    port.append(int(m.group(1)))
                    listening.set()
            listening.set()

        threading.Thread(target=read, daemon=True).start()
        assert listening.wait(30) and port, f"fdpp serve did not start: {''.join(self.stderr)}"
        self.port = port[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.model_id = None

    def wait_ready(self, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, f"fdpp serve exited: {''.join(self.stderr)}"
            try:
                r = httpx.get(self.url + "/health", timeout=5)
                if r.status_code == 200:
                    return
                assert r.status_code == 503 and r.json()["status"] == "loading"
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError("fdpp serve never became ready")

    def metrics(self):
        text = httpx.get(self.url + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start(*args, api_key=None):
    s = Server(*args)
    s.wait_ready()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    s.model_id = httpx.get(s.url + "/v1/models", headers=headers, timeout=10).json()["data"][0]["id"]
    return s


@pytest.fixture(scope="module")
def server():
    # 32 running sequences for the concurrency test; a short context keeps the CPU KV cache small.
    # CORS for one origin (test_cors); the other servers of the tests have it off, the default.
    s = start("--max-num-seqs", "32", "--ctx-size", "512", "--allowed-origins", ORIGIN)
    yield s
    s.stop()
