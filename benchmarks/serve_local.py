"""The local backend's own cost: wall time per engine iteration vs its forward pass.

Drives :class:`sloserve.serve.local.LocalBackend` in process (no HTTP: what is measured is
the engine, the worker thread and the hand-off to the event loop, not the web server):
``--streams`` concurrent requests of ``--prompt`` words and ``--tokens`` output tokens on
the ``--model-spec`` model (random weights) on ``--device``. Reports tokens/s, the
median and p90 forward pass (the executor's measured time), the median and p90 wall time
per iteration (consecutive iteration ends; the forward pass plus the gateway's share: the
hand-off, the policy's decision, the KV bookkeeping) and the largest gap the event loop
saw between two 5 ms ticks while the model ran (the loop must never wait for a forward
pass).

    PYTHONPATH=src python3 benchmarks/serve_local.py [--streams 8] [--tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

from sloserve.engine.execute import load_model
from sloserve.serve.backend import GenerationRequest
from sloserve.serve.emulated_config import EmulatedConfig
from sloserve.serve.local import LocalBackend


async def run(a: argparse.Namespace) -> None:
    be = LocalBackend(
        EmulatedConfig(policy=a.policy), load_model(model_spec=a.model_spec, device=a.device)
    )
    await be.start()
    gaps: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last - 0.005)
            last = now

    async def one(i: int) -> int:
        body = {"prompt": " ".join(f"w{i}x{j}" for j in range(a.prompt)), "max_tokens": a.tokens}
        req = GenerationRequest(
            f"cmpl-{i}", "completions", be.model_name, prompt_tokens=a.prompt + 1,
            max_tokens=a.tokens, arrival=time.monotonic(), body=body,
        )  # fmt: skip
        return sum([c.num_tokens async for c in be.generate(req)])

    ticker = asyncio.create_task(tick())
    t0 = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(i) for i in range(a.streams))))
    wall = time.perf_counter() - t0
    done.set()
    await ticker
    (inst,) = be.instances()
    assert be.executor is not None
    forward = np.array([r.measured_s for r in be.executor.records]) * 1e3
    per_iter = np.diff(np.asarray(inst.iter_end)) * 1e3
    await be.stop()
    print(f"{a.streams} streams x {a.tokens} tokens, {a.model_spec} on {a.device}, {a.policy}")
    print("| tokens/s | iterations | forward p50 / p90 ms | wall per iteration p50 / p90 ms "
          "| loop's worst stall ms |")  # fmt: skip
    print("|---|---|---|---|---|")
    print(
        f"| {tokens / wall:.0f} | {len(forward)} | {np.median(forward):.2f} / "
        f"{np.percentile(forward, 90):.2f} | {np.median(per_iter):.2f} / "
        f"{np.percentile(per_iter, 90):.2f} | {max(gaps) * 1e3:.1f} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=32, help="prompt words")
    ap.add_argument("--model-spec", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--policy", default="vllm")
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
