"""An external benchmark client (guidellm) against a live gateway, beside the server's metrics.

Starts ``--upstreams`` emulated engines (``sloserve serve --backend emulated``) and a
gateway in front of them (``sloserve serve --backend openai``), all on 127.0.0.1, runs
guidellm against the gateway (``--profile concurrent`` with ``--streams`` streams, stopping
after ``--requests`` requests; prompts of ``--prompt-words`` words asking for
``--output-tokens`` tokens) and compares what guidellm measured with what the servers
recorded for the same requests: the mean of ``sloserve_request_ttft_seconds`` and
``sloserve_request_tpot_seconds`` over the run (the difference of the histograms' sums and
counts before and after), at the gateway and, summed, at the upstreams (the gateway's own
overhead is the difference). guidellm's ITL is (latency − TTFT) / (tokens − 1) per request,
the same definition as the server's TPOT. ``--direct`` benchmarks one emulated server with
no gateway. Before guidellm, ``--probe N`` sequential requests from a plain httpx client
measure the TTFT offset of the HTTP path itself (client clock vs server clock) without
guidellm's own overhead.

guidellm is not a dependency of sloserve (it brings PyTorch and transformers): install it in
a throwaway virtual environment and point ``--guidellm`` at it::

    python -m venv /tmp/gl && /tmp/gl/bin/pip install guidellm
    python benchmarks/external_client.py --guidellm /tmp/gl/bin/guidellm

Needs no tokenizer download: the prompts come from a generated JSONL file and token counts
from the server's usage. guidellm (0.8) always asks for vLLM's
``stream_options.continuous_usage_stats``; the gateway supports it (every chunk then carries
the running usage), and the script turns it off through guidellm's request extras so that
the chunks are as small as a plain client's.

``--slow-upstream 0.5`` makes the last upstream half as fast (its ``--time-scale``), and
``--router round-robin,least-loaded,...`` runs the benchmark once per router: what routing
is worth with heterogeneous replicas.

Prints a table and one JSON line per run (``--out`` appends them to a file too).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODEL = "llama-2-7b"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "sloserve.cli", "serve", "--log-level", "error", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise SystemExit(f"server {url} exited: {err[-1000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"server {url} not healthy after {timeout} s")


def histogram_sums(url: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of the TTFT and TPOT histograms at ``url``, over all classes."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=5.0).text
    out: dict[str, list[float]] = {"ttft": [0.0, 0.0], "tpot": [0.0, 0.0]}
    for fam in text_string_to_metric_families(text):
        for kind in out:
            base = f"sloserve_request_{kind}_seconds"
            for s in fam.samples:
                if s.name == base + "_sum":
                    out[kind][0] += s.value
                elif s.name == base + "_count":
                    out[kind][1] += s.value
    return {k: (v[0], v[1]) for k, v in out.items()}


def delta_mean_ms(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], kind: str
) -> tuple[float, int]:
    s = after[kind][0] - before[kind][0]
    n = after[kind][1] - before[kind][1]
    return (s / n * 1e3 if n else math.nan), int(n)


def probe(url: str, n: int, prompt_words: int) -> tuple[float, float]:
    """Mean TTFT in ms of ``n`` sequential streams from a plain httpx client, as the client
    and as the server measured it: the HTTP path's own offset, without guidellm."""
    import httpx

    body = {"model": MODEL, "prompt": "word " * prompt_words, "max_tokens": 8, "stream": True}
    before = histogram_sums(url)
    seen = []
    with httpx.Client(timeout=30) as c:
        for _ in range(n):
            t0 = time.monotonic()
            first = None
            with c.stream("POST", url + "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if first is None and line.startswith("data:"):
                        first = time.monotonic() - t0
            if first is not None:
                seen.append(first)
    server, _ = delta_mean_ms(before, histogram_sums(url), "ttft")
    return sum(seen) / max(1, len(seen)) * 1e3, server


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def run(args: argparse.Namespace, guidellm: str) -> dict[str, Any]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        n_up = 1 if args.direct else args.upstreams
        up_ports = [free_port() for _ in range(n_up)]
        upstreams = [f"http://127.0.0.1:{p}" for p in up_ports]
        for k, p in enumerate(up_ports):
            extra = []
            if args.slow_upstream and k == n_up - 1 and not args.direct:
                extra = ["--time-scale", str(args.slow_upstream)]
            procs.append(serve("--backend", "emulated", "--port", str(p), "--model", MODEL, *extra))
        if args.direct:
            target = upstreams[0]
        else:
            gw_port = free_port()
            target = f"http://127.0.0.1:{gw_port}"
            gw = ["--backend", "openai", "--port", str(gw_port), "--router", args.router]
            for u in upstreams:
                gw += ["--upstream", u]
            procs.append(serve(*gw))
        urls = upstreams if args.direct else [*upstreams, target]
        for url, p in zip(urls, procs, strict=True):
            wait_healthy(url, p)

        tmp = Path(tempfile.mkdtemp(prefix="sloserve-guidellm-"))
        data = tmp / "prompts.jsonl"
        with data.open("w") as f:
            for i in range(args.requests):
                words = " ".join(["word"] * (args.prompt_words + i % 17))
                f.write(json.dumps({"prompt": words, "output_tokens_count": args.output_tokens}))
                f.write("\n")
        backend = {
            "kind": "openai_http",
            "target": target,
            "model": MODEL,
            "extras": {
                "body": {"stream_options": {"include_usage": True, "continuous_usage_stats": False}}
            },
        }
        out_json = tmp / "guidellm.json"
        cmd = [
            guidellm, "run",
            "--backend", json.dumps(backend),
            "--profile", f"kind=concurrent,streams={args.streams}",
            "--constraint", f"kind=max_requests,count={args.requests}",
            "--data", f"kind=json_file,path={data}",
            "--output", f"kind=json,path={out_json}",
            "--disable-console-interactive",
        ]  # fmt: skip
        probe_ms = probe(target, args.probe, args.prompt_words) if args.probe else None
        before = {u: histogram_sums(u) for u in {*upstreams, target}}
        t0 = time.monotonic()
        env = {**os.environ, "GUIDELLM__LOGGING__CONSOLE_LOG_LEVEL": "WARNING"}
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
        wall = time.monotonic() - t0
        if res.returncode != 0 or not out_json.exists():
            tail = (res.stdout + res.stderr)[-3000:]
            raise SystemExit(f"guidellm failed ({res.returncode}):\n{tail}")
        after = {u: histogram_sums(u) for u in {*upstreams, target}}

        bench = json.loads(out_json.read_text())["benchmarks"][0]
        m = bench["metrics"]

        def gl(name: str) -> float:
            return float(m[name]["successful"]["mean"])

        gw_ttft, n_ttft = delta_mean_ms(before[target], after[target], "ttft")
        gw_tpot, n_tpot = delta_mean_ms(before[target], after[target], "tpot")
        up_sum = {k: [0.0, 0.0] for k in ("ttft", "tpot")}
        if not args.direct:
            for u in upstreams:
                for k in up_sum:
                    up_sum[k][0] += after[u][k][0] - before[u][k][0]
                    up_sum[k][1] += after[u][k][1] - before[u][k][1]
        result: dict[str, Any] = {
            "target": "emulated (direct)" if args.direct else f"gateway -> {n_up} emulated",
            "router": None if args.direct else args.router,
            "slow_upstream": None if args.direct else args.slow_upstream,
            "streams": args.streams,
            "requests": args.requests,
            "output_tokens": args.output_tokens,
            "guidellm_successful": int(bench["requests"]["successful"].__len__()),
            "guidellm_errored": int(bench["requests"]["errored"].__len__()),
            "guidellm_ttft_ms": gl("time_to_first_token_ms"),
            "guidellm_itl_ms": gl("inter_token_latency_ms"),
            "guidellm_tpot_ms": gl("time_per_output_token_ms"),
            "guidellm_output_tokens_mean": gl("output_token_count"),
            "server_requests": n_ttft,
            "server_ttft_ms": gw_ttft,
            "server_tpot_ms": gw_tpot,
            "server_tpot_requests": n_tpot,
            "wall_s": round(wall, 1),
        }
        if not args.direct and up_sum["ttft"][1]:
            result["upstream_ttft_ms"] = up_sum["ttft"][0] / up_sum["ttft"][1] * 1e3
            result["upstream_tpot_ms"] = up_sum["tpot"][0] / max(1.0, up_sum["tpot"][1]) * 1e3
        if probe_ms is not None:
            result["probe_client_ttft_ms"], result["probe_server_ttft_ms"] = probe_ms
        result["ttft_rel_diff"] = (result["guidellm_ttft_ms"] - gw_ttft) / gw_ttft
        result["itl_rel_diff"] = (result["guidellm_itl_ms"] - gw_tpot) / gw_tpot
        return result
    finally:
        for p in procs:
            stop(p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--guidellm", default=None, help="guidellm executable (default: on PATH)")
    ap.add_argument("--upstreams", type=int, default=2)
    ap.add_argument(
        "--router", default="least-loaded", help="router, or a comma list to run each in turn"
    )
    ap.add_argument(
        "--slow-upstream",
        type=float,
        default=None,
        help="the last upstream runs at this --time-scale (e.g. 0.5: a GPU half as fast)",
    )
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--prompt-words", type=int, default=100)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--direct", action="store_true", help="no gateway: one emulated server")
    ap.add_argument(
        "--probe",
        type=int,
        default=20,
        help="sequential plain-httpx requests first, to measure the HTTP path's TTFT offset "
        "(0: none)",
    )
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    guidellm = args.guidellm or shutil.which("guidellm")
    if guidellm is None or not Path(guidellm).exists():
        raise SystemExit(
            "guidellm not found: python -m venv /tmp/gl && /tmp/gl/bin/pip install guidellm, "
            "then --guidellm /tmp/gl/bin/guidellm"
        )
    routers = [args.router] if args.direct else args.router.split(",")
    for router in routers:
        args.router = router
        r = run(args, guidellm)
        where = r["target"] + (f", router {router}" if not args.direct else "")
        print(f"{where}: {r['requests']} requests, {r['streams']} streams, {r['wall_s']} s")
        print(f"{'':28}{'guidellm':>12}{'server':>12}{'diff':>9}")
        print(
            f"{'TTFT mean (ms)':28}{r['guidellm_ttft_ms']:12.1f}{r['server_ttft_ms']:12.1f}"
            f"{r['ttft_rel_diff']:9.1%}"
        )
        print(
            f"{'ITL / TPOT mean (ms)':28}{r['guidellm_itl_ms']:12.2f}{r['server_tpot_ms']:12.2f}"
            f"{r['itl_rel_diff']:9.1%}"
        )
        if "probe_client_ttft_ms" in r:
            print(
                f"{'probe TTFT, httpx (ms)':28}{r['probe_client_ttft_ms']:12.1f}"
                f"{r['probe_server_ttft_ms']:12.1f}   (sequential, plain httpx client)"
            )
        if "upstream_ttft_ms" in r:
            print(f"{'upstream TTFT mean (ms)':28}{'':12}{r['upstream_ttft_ms']:12.1f}")
            print(f"{'upstream TPOT mean (ms)':28}{'':12}{r['upstream_tpot_ms']:12.2f}")
        line = json.dumps(r)
        print(line)
        if args.out is not None:
            with args.out.open("a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
