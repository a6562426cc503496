"""Gateway load and sim-vs-live benchmarks on loopback.

``load`` (the default): N concurrent streaming completions against the emulated backend,
twice on the very same engine configuration:

1. **in-process**: N asyncio consumers call ``EmulatedBackend.generate`` directly;
2. **HTTP**: the gateway runs in its own process (``create_app`` + uvicorn, as
   ``sloserve serve`` runs it) and a light raw-socket client in this process opens N
   HTTP/1.1 connections and reads the SSE streams.

Each stream is a completion of ``--prompt`` token ids and ``max_tokens`` = ``--max-tokens``,
started at evenly spread times over ``--ramp`` seconds. For every token the benchmark knows
when the engine emitted it (the end of its iteration, mapped to monotonic time; the server
process dumps these per response id at shutdown, and CLOCK_MONOTONIC is system-wide) and
when the consumer received it. The per-chunk **delivery delay** is received − emitted; the
gateway's **overhead per chunk** is the HTTP run's delay percentiles minus the in-process
run's. Also: tokens/s received, errors, CPU seconds per chunk of the engine process (the
server's from its start to its shutdown; in-process: engine plus consumers), peak RSS of
the server process (VmHWM) and of this process, and the load average (the machine is
shared: delays are wall-clock and grow when the processes do not get a core, while CPU per
chunk is what the gateway costs).

With ``--workers N`` the client talks instead to ``sloserve serve --backend openai
--workers N`` (N gateway processes on one port) in front of that HTTP gateway: the
overhead is then both hops' (the proxy's server CPU is not in the server CPU figures).

``agreement``: a ShareGPT-like workload (``--workload``, Poisson arrivals) through
``experiments.runner.simulate`` and through the live gateway (requests sent at their
arrival times): mean TTFT and TPOT of both and their relative difference; the live
scheduling overhead is the mean extra TTFT (live − simulated), in milliseconds.

    python benchmarks/serve_load.py load [--streams 1000] [--max-tokens 128] [--workers N]
    python benchmarks/serve_load.py load --result-format vllm --result-file res.json

With ``--result-format vllm`` the load mode also writes the HTTP run as the JSON
``vllm bench serve --save-result`` writes (client-side times: send, each SSE chunk), to
``--result-file`` (default ``serve_load_vllm.json``).
    python benchmarks/serve_load.py agreement [--num-requests 200] [--rate 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import numpy as np

from sloserve.experiments.runner import InstanceConfig
from sloserve.serve.backend import GenerationRequest
from sloserve.serve.emulated import EmulatedBackend, EmulatedConfig

MODEL = "bench"


def _config(args: argparse.Namespace) -> EmulatedConfig:
    return EmulatedConfig(
        instance=InstanceConfig(profile=args.profile, max_running=args.max_running),
        policy=args.policy,
        time_scale=args.time_scale,
        served_model_name=MODEL,
    )


def _run(coro: Any) -> Any:
    """``asyncio.run`` on uvloop when installed (as the server runs): the client and the
    in-process reference get the same event loop as the gateway."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _sys_s() -> float:
    """Kernel CPU seconds: on loopback a socket write runs the receiver's TCP path too."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def _pct(x: np.ndarray) -> dict[str, float]:
    return {
        "p50_ms": float(np.percentile(x, 50) * 1e3),
        "p99_ms": float(np.percentile(x, 99) * 1e3),
        "max_ms": float(x.max() * 1e3),
    }


# ----------------------------------------------------------------------------- in-process
async def _in_process(args: argparse.Namespace) -> dict[str, Any]:
    be = EmulatedBackend(_config(args))
    be.log = []
    await be.start()
    cpu = _cpu_s()
    received: dict[str, list[float]] = {}
    t0 = time.monotonic() + 0.1
    errors = 0

    async def one(i: int) -> None:
        nonlocal errors
        await asyncio.sleep(max(0.0, t0 + i * args.ramp / args.streams - time.monotonic()))
        rid = f"cmpl-{i}"
        req = GenerationRequest(
            request_id=rid, endpoint="completions", model=MODEL,
            prompt_tokens=args.prompt, max_tokens=args.max_tokens, arrival=time.monotonic(),
        )  # fmt: skip
        times = received.setdefault(rid, [])
        try:
            async for c in be.generate(req):
                times.append(time.monotonic())
                if c.finish_reason is not None and c.finish_reason != "length":
                    errors += 1
        except Exception:
            errors += 1

    await asyncio.gather(*(one(i) for i in range(args.streams)))
    cpu = _cpu_s() - cpu
    emitted = {rid: be.token_times(rep, r) for rid, rep, r in be.log}
    await be.stop(0)
    res = _delays("in-process", received, emitted, errors, t0)
    res["cpu_s"] = cpu
    res["cpu_us_per_chunk"] = cpu / max(1, res["chunks"]) * 1e6
    return res


def _delays(
    name: str,
    received: dict[str, list[float]],
    emitted: dict[str, np.ndarray],
    errors: int,
    t0: float,
) -> dict[str, Any]:
    delays: list[np.ndarray] = []
    for rid, times in received.items():
        e = emitted.get(rid)
        if e is None or len(e) != len(times):
            errors += 1
            continue
        delays.append(np.asarray(times) - e)
    d = np.concatenate(delays) if delays else np.zeros(1)
    last = max((t[-1] for t in received.values() if t), default=t0)
    ends = np.concatenate(list(emitted.values())) if emitted else np.zeros(0)
    chunks = sum(len(t) for t in received.values())
    return {
        "run": name,
        "streams": len(received),
        "chunks": chunks,
        "errors": errors,
        "tokens_per_s": chunks / (last - t0),
        "delay": _pct(d),
        "early_chunks": int((d < -1e-6).sum()),
        # chunks the engine emits at one iteration end: the burst the gateway must write
        "chunks_per_iteration": float(len(ends) / max(1, len(np.unique(ends)))),
    }


# ----------------------------------------------------------------------------- HTTP
def _serve_process(cfg_json: str, sock: socket.socket, out: str, ready: Any) -> None:
    """The gateway in a child process; at shutdown it dumps the engine's emit times."""
    import uvicorn

    from sloserve.serve.api import create_app
    from sloserve.serve.server import server_options

    be = EmulatedBackend(EmulatedConfig.model_validate_json(cfg_json))
    be.log = []
    config = uvicorn.Config(
        create_app(be), log_level="warning", timeout_graceful_shutdown=5, backlog=4096,
        **server_options(),
    )  # fmt: skip
    server = uvicorn.Server(config)
    emitted: dict[str, list[float]] = {}

    orig_stop = be.stop
    orig_start = be.start
    cpu_at_start = [0.0, 0.0]

    async def start() -> None:
        cpu_at_start[:] = [_cpu_s(), _sys_s()]
        await orig_start()

    users: dict[str, str] = {}  # request id -> the client's stream tag (its `user` field)
    orig_generate = be.generate

    def generate(req: GenerationRequest) -> Any:
        users[req.request_id] = str(req.body.get("user", req.request_id))
        return orig_generate(req)

    async def stop(drain_timeout_s: float = 30.0) -> None:
        for rid, rep, r in be.log or []:
            emitted[users.get(rid, rid)] = be.token_times(rep, r).tolist()
        await orig_stop(drain_timeout_s)

    be.generate = generate  # type: ignore[method-assign]

    be.stop = stop  # type: ignore[method-assign]
    be.start = start  # type: ignore[method-assign]
    # uvicorn re-raises the signal that stopped it once it has shut down: make that a no-op
    # so that the emit times get written.
    signal.signal(signal.SIGINT, lambda _s, _f: None)
    ready.set()
    server.run(sockets=[sock])
    Path(out).write_text(
        json.dumps(
            {"emitted": emitted, "peak_rss_mib": _peak_rss_mib(),
             "cpu_s": _cpu_s() - cpu_at_start[0], "sys_s": _sys_s() - cpu_at_start[1]}
        )
    )  # fmt: skip


class _SSEClient(asyncio.Protocol):
    """One streaming POST read by a bare protocol: every received segment is stamped on
    arrival and parsed in place (chunked framing, SSE events), with no coroutine wake-up
    per chunk. The client shares the machine's cores with the gateway, so its cost per
    chunk shows up in the measured delays: keep it lean."""

    def __init__(self, request: bytes, done: asyncio.Future[None]) -> None:
        self.request = request
        self.done = done
        self.buf = b""
        self.sse = b""
        self.head = True
        self.status = 0
        self.rid: str | None = None
        self.times: list[float] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.WriteTransport, transport).write(self.request)  # uvloop's: no subclass

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        buf = self.buf + data
        if self.head:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.buf = buf
                return
            self.status = int(buf[: buf.index(b"\r\n")].split()[1])
            if self.status != 200 or b"chunked" not in buf[:end].lower():
                self._finish()
                return
            buf = buf[end + 4 :]
            self.head = False
        pos, sse = 0, self.sse
        while True:  # chunked framing: SIZE\r\nDATA\r\n
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(buf[pos:eol], 16)
            if size == 0:
                self._events(sse, now)
                self._finish()
                return
            if len(buf) < eol + 2 + size + 2:
                break
            sse += buf[eol + 2 : eol + 2 + size]
            pos = eol + 2 + size + 2
        self.buf = buf[pos:]
        self.sse = self._events(sse, now)

    def _events(self, sse: bytes, now: float) -> bytes:
        *events, rest = sse.split(b"\n\n")
        for ev in events:
            if ev.startswith(b"data: {"):
                if self.rid is None:
                    self.rid = json.loads(ev[6:])["id"]
                if ev.startswith(b'data: {"error"'):
                    self.status = 599
                elif b'"text":""' not in ev:  # a token (a proxy may add an empty finish chunk)
                    self.times.append(now)
        return rest

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.head:
            self.status = 598
        self._finish()


async def _stream_one(port: int, body: bytes) -> tuple[str | None, list[float], int]:
    """One streaming POST: (response id, chunk receive times, status)."""
    loop = asyncio.get_running_loop()
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    done: asyncio.Future[None] = loop.create_future()
    transport, proto = await loop.create_connection(
        lambda: _SSEClient(head.encode() + body, done), "127.0.0.1", port
    )
    try:
        await done
    finally:
        transport.close()
    return proto.rid, proto.times, proto.status


async def _http_client(
    args: argparse.Namespace, port: int, sent: dict[str, float] | None = None
) -> tuple[dict[str, list[float]], int, float]:
    def body(i: int) -> bytes:
        # `user` tags the stream: the engine's process keys its emit times by it (a proxy
        # in between gives the response an id of its own)
        return json.dumps(
            {"model": MODEL, "prompt": [7] * args.prompt, "max_tokens": args.max_tokens,
             "stream": True, "user": f"stream-{i}"}
        ).encode()  # fmt: skip

    t0 = time.monotonic() + 0.1
    received: dict[str, list[float]] = {}
    errors = 0

    async def one(i: int) -> None:
        nonlocal errors
        await asyncio.sleep(max(0.0, t0 + i * args.ramp / args.streams - time.monotonic()))
        at = time.monotonic()
        try:
            rid, times, status = await _stream_one(port, body(i))
        except Exception:
            errors += 1
            return
        if status != 200 or rid is None or len(times) != args.max_tokens:
            errors += 1
        if rid is not None:
            received[f"stream-{i}"] = times
            if sent is not None:
                sent[f"stream-{i}"] = at

    await asyncio.gather(*(one(i) for i in range(args.streams)))
    return received, errors, t0


def _start_proxy(args: argparse.Namespace, upstream_port: int) -> tuple[Any, int]:
    """``sloserve serve --backend openai --workers N`` in front of the engine's gateway."""
    import subprocess
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sloserve.cli", "serve", "--backend", "openai",
         "--upstream", f"http://127.0.0.1:{upstream_port}", "--served-model-name", MODEL,
         "--workers", str(args.workers), "--port", str(port), "--health-interval-s", "0",
         "--max-queue", str(4 * args.streams), "--max-concurrency", str(2 * args.streams)],
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return proc, port
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the proxy gateway did not start") from None
            time.sleep(0.2)


def _http(args: argparse.Namespace) -> dict[str, Any]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    ctx = mp.get_context("fork")  # the socket is inherited
    ready = ctx.Event()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "server.json")
        proc = ctx.Process(
            target=_serve_process, args=(_config(args).model_dump_json(), sock, out, ready)
        )
        proc.start()
        ready.wait(30)
        time.sleep(1.0)  # uvicorn listening
        proxy = _start_proxy(args, port) if args.workers else None
        cpu, sys_s = _cpu_s(), _sys_s()
        sent: dict[str, float] = {}
        received, errors, t0 = _run(_http_client(args, proxy[1] if proxy else port, sent))
        wall = time.monotonic() - t0
        client_cpu, client_sys = _cpu_s() - cpu, _sys_s() - sys_s
        if proxy is not None:
            proxy[0].send_signal(signal.SIGTERM)
            proxy[0].wait(60)
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGINT)
        proc.join(60)
        data = json.loads(Path(out).read_text())
    emitted = {k: np.asarray(v) for k, v in data["emitted"].items()}
    res = _delays(f"http via {args.workers} proxy workers" if args.workers else "http",
                  received, emitted, errors, t0)  # fmt: skip
    res["server_peak_rss_mib"] = data["peak_rss_mib"]
    res["server_cpu_s"] = data["cpu_s"]
    res["server_sys_s"] = data["sys_s"]
    res["client_cpu_s"] = client_cpu
    res["client_sys_s"] = client_sys
    res["server_cpu_us_per_chunk"] = data["cpu_s"] / max(1, res["chunks"]) * 1e6
    if args.result_format == "vllm":
        _write_vllm(args, sent, received, errors, wall)
    return res


def _write_vllm(
    args: argparse.Namespace,
    sent: dict[str, float],
    received: dict[str, list[float]],
    errors: int,
    wall: float,
) -> None:
    """The HTTP run as ``vllm bench serve --save-result`` JSON (client-side clock)."""
    import datetime

    from sloserve.experiments.vllm_result import vllm_metrics

    ok = [r for r in sent if len(received.get(r, [])) == args.max_tokens]
    records = [(sent[r], np.asarray(received[r]), args.prompt) for r in sorted(ok)]
    doc: dict[str, Any] = {
        "date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai",
        "backend": "openai",
        "label": "sloserve-gateway",
        "model_id": MODEL,
        "tokenizer_id": None,
        "num_prompts": args.streams,
        "request_rate": args.streams / args.ramp if args.ramp > 0 else "inf",
        "burstiness": 1.0,
        "max_concurrency": None,
        "profile": args.profile,
        "policy": args.policy,
    }
    doc.update(vllm_metrics(records, failed=args.streams - len(records), duration=wall))
    Path(args.result_file).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"vLLM-format result written to {args.result_file}", file=sys.stderr)


def load(args: argparse.Namespace) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (20000, 20000))
    load_before = os.getloadavg()
    runs = [_run(_in_process(args)), _http(args)]
    inp, http = runs
    summary = {
        "streams": args.streams,
        "max_tokens": args.max_tokens,
        "profile": args.profile,
        "time_scale": args.time_scale,
        "proxy_workers": args.workers,
        "overhead_per_chunk_p50_ms": http["delay"]["p50_ms"] - inp["delay"]["p50_ms"],
        "overhead_per_chunk_p99_ms": http["delay"]["p99_ms"] - inp["delay"]["p99_ms"],
        "server_cpu_overhead_us_per_chunk": http["server_cpu_us_per_chunk"]
        - inp["cpu_us_per_chunk"],
        "client_cpu_us_per_chunk": http["client_cpu_s"] / max(1, http["chunks"]) * 1e6,
        "client_peak_rss_mib": _peak_rss_mib(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    for r in runs:
        print(json.dumps(r))
    print(json.dumps(summary))


# ----------------------------------------------------------------------------- agreement
def agreement(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from serve_helpers import live_server, replay_over_http
    from sloserve.experiments.runner import SimConfig, simulate, workload_requests
    from sloserve.workloads.spec import WorkloadSpec

    icfg = InstanceConfig(profile=args.profile, max_running=args.max_running)
    spec = WorkloadSpec.model_validate(
        {"mix": args.workload, "num_requests": args.num_requests, "seed": args.seed,
         "arrival": {"kind": "poisson", "rate": args.rate}, "slo": "none"}
    )  # fmt: skip
    cfg = SimConfig(workload=spec, instance=icfg, policy=args.policy)
    reqs = [r for r in workload_requests(cfg) if r.num_prompt_tokens + r.true_output_len <= 4096]
    sim = simulate(cfg, reqs).table
    load_before = os.getloadavg()
    with live_server(instance=icfg, policy=args.policy, time_scale=args.time_scale) as srv:
        t = time.monotonic()
        live = asyncio.run(replay_over_http(srv.base_url, reqs, args.time_scale))
        wall = time.monotonic() - t
    same = bool((live["tokens"].to_numpy() == sim["generated_tokens"].to_numpy()).all())
    out: dict[str, Any] = {
        "requests": len(reqs), "policy": args.policy, "profile": args.profile,
        "workload": args.workload, "rate": args.rate, "time_scale": args.time_scale,
        "wall_s": wall, "max_send_lateness_ms": float(live["late_s"].max() * 1e3),
        "tokens_match": same,
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
    }  # fmt: skip
    for col in ("ttft_s", "tpot_s"):
        s, v = float(sim[col].mean()), float(live[col].mean())
        out[f"sim_{col}_mean"] = s
        out[f"live_{col}_mean"] = v
        out[f"{col}_rel_diff"] = (v - s) / s
    extra = (live["ttft_s"].to_numpy() - sim["ttft_s"].to_numpy()) / args.time_scale
    out["live_extra_ttft_ms_mean"] = float(extra.mean() * 1e3)
    out["live_extra_ttft_ms_p99"] = float(np.percentile(extra, 99) * 1e3)
    print(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("mode", nargs="?", default="load", choices=["load", "agreement"])
    p.add_argument("--profile", default="llama-3-8b@a100-80gb")
    p.add_argument("--policy", default="vllm")
    p.add_argument("--max-running", type=int, default=1024)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--streams", type=int, default=1000)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--ramp", type=float, default=1.0, help="seconds over which streams start")
    p.add_argument("--workload", default="sharegpt")
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--rate", type=float, default=4.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-format", choices=["sloserve", "vllm"], default="sloserve")
    p.add_argument("--result-file", default="serve_load_vllm.json")
    p.add_argument(
        "--workers", type=int, default=0,
        help="0: the client talks to the engine's gateway; N: through `sloserve serve "
        "--backend openai --workers N` in front of it (the overhead is then both gateways')",
    )  # fmt: skip
    args = p.parse_args()
    (load if args.mode == "load" else agreement)(args)


if __name__ == "__main__":
    main()
