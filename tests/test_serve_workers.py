"""``sloserve serve --workers N`` (issue 19, item 8): N gateway processes on one port in
front of an upstream (here an emulated gateway on 127.0.0.1), metrics summed over them."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from serve_helpers import MODEL, live_server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ok_total(text: str) -> float:
    return sum(
        float(m.group(1))
        for m in re.finditer(
            r'^sloserve_requests_total\{[^}]*status="ok"[^}]*\} (\S+)$', text, re.M
        )
    )


def test_two_workers_share_the_port_and_their_metrics() -> None:
    port = _free_port()
    with live_server() as upstream:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sloserve.cli", "serve", "--backend", "openai",
             "--upstream", upstream.url, "--served-model-name", MODEL, "--workers", "2",
             "--port", str(port), "--health-interval-s", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
                time.sleep(0.1)

            def one(i: int) -> str:
                body = {"model": MODEL, "prompt": f"hello {i}", "max_tokens": 3,
                        "stream": i % 2 == 0}  # fmt: skip
                # a new connection each: the kernel hands them to either worker
                r = httpx.post(f"{base}/v1/completions", json=body, timeout=30)
                assert r.status_code == 200, r.text
                return r.headers["x-sloserve-worker-pid"]

            sent = 0
            pids: set[str] = set()
            with ThreadPoolExecutor(8) as pool:
                while len(pids) < 2 and sent < 400:
                    pids |= set(pool.map(one, range(sent, sent + 40)))
                    sent += 40
            assert len(pids) == 2, pids
            assert str(proc.pid) not in pids  # the supervisor itself serves nothing
            # whichever worker answers the scrape, the counters are the sum of both
            for _ in range(6):
                text = httpx.get(f"{base}/metrics", timeout=10).text
                assert _ok_total(text) == sent
        finally:
            proc.send_signal(signal.SIGTERM)
            _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    assert "2 workers" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "2"], "--workers 2 needs --backend openai"),
        (["--workers", "0"], "workers"),
        (["--backend", "openai", "--upstream", "http://127.0.0.1:9", "--workers", "300"],
         "workers"),
        (["--request-read-timeout-s", "0"], "request_read_timeout_s"),
        (["--request-read-timeout-s", "inf"], "request_read_timeout_s"),
        (["--max-body-bytes", "10"], "max_body_bytes"),
    ],
)  # fmt: skip
def test_serve_option_errors(args: list[str], message: str) -> None:
    from typer.testing import CliRunner

    from sloserve.cli import app
    from sloserve.core.errors import SloserveError

    r = CliRunner().invoke(app, ["serve", *args])
    assert isinstance(r.exception, SloserveError), r.output
    assert message in str(r.exception)
    assert "\n" not in str(r.exception)
