"""Engine CPU with and without the chunk runs of ``engine/chunk_run.py`` (or, with
``--feature decode``, the promised decode runs of ``engine/decode_run.py``), in one process.

Runs one ``sloserve`` CLI command (default: ``sim_e2e.py``'s 4-replica run) ``--pairs``
times with the feature off and on in alternation (off: ``chunk_run.eligible`` answers
False, or ``decode_run.repeat`` None: the engine as it was before them), timing
``Environment.run`` with ``time.process_time``, and prints both medians, the paired
ratios, the decisions of each (batches applied) and whether the two printed the same
output (wall-clock fields aside). One process for both: on a shared machine the pairs
see the same load and the same warm interpreter, so small differences show.

    python benchmarks/chunk_runs_ab.py --pairs 8 [--feature decode] [-- simulate ... --json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import time
from typing import Any

from sloserve.engine import chunk_run, decode_run
from sloserve.engine import env as envmod
from sloserve.engine import instance as instmod

CLUSTER = [
    "simulate",
    "--profile",
    "llama-2-70b-a100x2",
    "--max-running",
    "128",
    "--max-batch-tokens",
    "4096",
    "--trace",
    "/tmp/sloserve-bench/azure_conv_16384_rate4.csv",
    "--policy",
    "sarathi",
    "--replicas",
    "4",
    "--router",
    "least-outstanding",
    "--json",
]


def _clean(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items() if "wall" not in k}
    return x


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--feature", choices=("chunk", "decode"), default="chunk")
    ap.add_argument("args", nargs="*", help="the CLI command (after --); default: 4 replicas")
    a = ap.parse_args()
    if a.pairs < 1:
        print("chunk_runs_ab.py: --pairs must be >= 1", file=sys.stderr)
        return 2
    args = a.args or CLUSTER
    real_run, real_apply, real_eligible, real_repeat = (
        envmod.Environment.run,
        instmod.Instance._apply,
        chunk_run.eligible,
        decode_run.repeat,
    )
    spent, applied = [0.0], [0]

    def timed(self: envmod.Environment, until: float = float("inf")) -> None:
        t = time.process_time()
        try:
            real_run(self, until)
        finally:
            spent[0] += time.process_time() - t

    def counted(self: instmod.Instance, out: Any, now: float) -> Any:
        applied[0] += 1
        return real_apply(self, out, now)

    envmod.Environment.run = timed  # type: ignore[method-assign]
    instmod.Instance._apply = counted  # type: ignore[method-assign]
    from sloserve.cli import main as cli_main

    cpu: dict[str, list[float]] = {"off": [], "on": []}
    decisions: dict[str, int] = {}
    outputs: dict[str, Any] = {}
    load = os.getloadavg()
    for _ in range(a.pairs):
        for mode in ("off", "on"):
            on = mode == "on" or a.feature != "chunk"
            chunk_run.eligible = real_eligible if on else (lambda inst: False)  # type: ignore[assignment]
            on = mode == "on" or a.feature != "decode"
            decode_run.repeat = real_repeat if on else (lambda inst, cont: None)  # type: ignore[assignment]
            spent[0], applied[0] = 0.0, 0
            sys.argv = ["sloserve", *args]
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                try:
                    cli_main()
                except SystemExit as e:
                    if e.code:
                        raise
            cpu[mode].append(spent[0])
            decisions[mode] = applied[0]
            outputs[mode] = _clean(json.loads(out.getvalue()))
    chunk_run.eligible = real_eligible  # type: ignore[assignment]
    decode_run.repeat = real_repeat  # type: ignore[assignment]
    for mode, xs in cpu.items():
        print(
            f"{mode}: engine CPU median {statistics.median(xs):.3f} s "
            f"({min(xs):.3f}-{max(xs):.3f}), {decisions[mode]} decisions"
        )
    ratios = [b / a_ for a_, b in zip(cpu["off"], cpu["on"], strict=True)]
    print(
        f"on/off paired median {statistics.median(ratios):.3f} "
        f"({min(ratios):.3f}-{max(ratios):.3f}); outputs equal: {outputs['on'] == outputs['off']}"
    )
    print(f"load average: {load} -> {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
