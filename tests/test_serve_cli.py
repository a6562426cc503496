"""``sloserve serve`` from the command line: a real process that answers streams and stops
cleanly on SIGTERM, the openai backend's options (a --config YAML, flags on top), and
the user errors for bad options."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest

from serve_helpers import _MSG, MODEL
from sloserve.core.errors import SloserveError


def test_cli_serve_process() -> None:
    """``python -m sloserve.cli serve`` answers streams, then SIGTERM stops it cleanly."""
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sloserve.cli", "serve", "--port", str(port), "--replicas", "2",
         "--policy", "sarathi", "--router", "round-robin", "--time-scale", "20",
         "--output-length", "uniform:3:6", "--max-running", "64"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
        for _ in range(2):
            messages: Any = _MSG
            chunks = list(
                client.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=50, stream=True
                )
            )
            assert 3 <= len(chunks) - 1 <= 6 and chunks[-1].choices[0].finish_reason == "stop"
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert 'sloserve_replica_running{replica="replica-1"}' in text
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises the signal (the usual exit for a daemon)
    assert proc.returncode in (0, -signal.SIGTERM), err
    assert "Traceback" not in err, err
    assert "emulated llama-2-7b@a100-80gb x2, policy sarathi, router round-robin" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "gpt-5"], "unknown model 'gpt-5'"),
        (["--policy", "nope"], "unknown policy 'nope'"),
        (["--router", "nope"], "unknown router 'nope'"),
        (["--replicas", "0"], "replicas"),
        (["--time-scale", "-1"], "time_scale"),
        (["--output-length", "normal:3"], "--output-length"),
        (["--backend", "tgi"], "unknown --backend"),
        (["--backend", "openai"], "--upstream"),
        (["--backend", "openai", "--upstream", "ftp://x"], "not an http"),
        (["--slo-preset", "gold"], "slo_preset"),
        (["--admission", "maybe"], "admission"),
        (["--admission", "none", "--max-queue", "3"], "max_queue needs"),
        (["--drain-timeout", "inf"], "drain_timeout_s"),
    ],
)
def test_cli_serve_bad_options(args: list[str], message: str) -> None:
    from typer.testing import CliRunner

    from sloserve.cli import app

    result = CliRunner().invoke(app, ["serve", *args])
    assert result.exit_code != 0
    assert isinstance(result.exception, SloserveError), result.output
    assert message in str(result.exception)


def test_cli_openai_backend_options(tmp_path: Any) -> None:
    """Every UpstreamConfig knob is reachable: --config YAML first, flags on top."""
    from sloserve.cli.serve import _upstream_backend

    cfg = tmp_path / "up.yaml"
    cfg.write_text("upstreams: [http://a:8000]\nretries: 5\nbreaker_open_s: 9\nread_timeout_s: 7\n")
    flags: dict[str, Any] = {
        "retries": 1, "breaker_failures": 4, "health_interval_s": 0.5,
        "connect_timeout_s": 0.25, "forward_priority": True, "forward_slo": True,
        "admission": None, "router": None,
    }  # fmt: skip
    be = _upstream_backend([], cfg, None, flags)
    c = be.config
    assert c.upstreams == ("http://a:8000",)
    assert (c.retries, c.breaker_failures, c.breaker_open_s) == (1, 4, 9.0)
    assert (c.health_interval_s, c.connect_timeout_s, c.read_timeout_s) == (0.5, 0.25, 7.0)
    assert c.forward_priority and c.forward_slo
    assert c.admission == "queue" and c.router == "least-loaded"  # the defaults agree
    be = _upstream_backend(["http://b:1"], None, "m", {"retries": None})
    assert be.config.upstreams == ("http://b:1",) and be.config.retries == 2
    assert be.config.models == ("m",)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--retries", "-1"], "retries"),
        (["--breaker-failures", "0"], "breaker_failures"),
        (["--read-timeout-s", "0"], "read_timeout_s"),
        (["--profile", "llama-2-7b@nowhere"], "unknown GPU"),
    ],
)
def test_cli_openai_bad_options(args: list[str], message: str) -> None:
    from typer.testing import CliRunner

    from sloserve.cli import app

    result = CliRunner().invoke(
        app, ["serve", "--backend", "openai", "--upstream", "http://a:1", *args]
    )
    assert result.exit_code != 0
    assert isinstance(result.exception, SloserveError), result.output
    assert message in str(result.exception)
