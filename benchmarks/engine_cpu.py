"""CPU seconds spent inside the engine (``Environment.run``) for the runs of ``sim_e2e.py``.

The whole-process times of ``benchmarks/sim_e2e.py`` mix start-up, trace loading, the
request table and the summary with the simulation itself; this script isolates the
engine: each run is a fresh process running the very same CLI command, with
``Environment.run`` wrapped by ``time.process_time`` (CPU, not wall: the development
machine is shared, so wall time moves with its load). It prints the CPU seconds, the
decisions (the batches the engine applied: policy calls that scheduled something; the
trace keeps one row per decision the engine would have taken without the chunk runs of
``engine/chunk_run.py``, the summary's ``scheduling_decisions``) and the microseconds per
decision. With ``--base SRC`` (another checkout's ``src`` directory) the runs of the two
trees alternate, base first, and the paired ratios are printed too: on a loaded machine
only paired, alternating measurements compare.

    python benchmarks/sim_e2e.py --print-commands      # the runs (traces cached there)
    python benchmarks/engine_cpu.py --repeat 5 [--runs single,cluster] [--base ../main/src]
        [--extra=--no-prefix-caching]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

# Runs in the child: time Environment.run, run the CLI command, print one JSON line.
_CHILD = """
import contextlib, io, json, sys, time
sys.path.insert(0, sys.argv[1])
from sloserve.engine import env as envmod
real, spent = envmod.Environment.run, [0.0]
def timed(self, until=float("inf")):
    t = time.process_time()
    try:
        real(self, until)
    finally:
        spent[0] += time.process_time() - t
envmod.Environment.run = timed
from sloserve.engine import instance as instmod
applied, real_apply = [0], instmod.Instance._apply
def counted(self, out, now):
    applied[0] += 1
    return real_apply(self, out, now)
instmod.Instance._apply = counted
from sloserve.cli import main
out = io.StringIO()
sys.argv = ["sloserve", *sys.argv[2:]]
with contextlib.redirect_stdout(out):
    try:
        main()
    except SystemExit as e:
        if e.code:
            raise
summary = json.loads(out.getvalue())
print(json.dumps({"engine_cpu_s": spent[0],
                  "decisions": applied[0],
                  "trace_rows": summary.get("scheduling_decisions"),
                  "summary": summary}))
"""


def commands() -> dict[str, list[str]]:
    """The CLI arguments of sim_e2e.py's runs (it writes the traces when missing)."""
    out = subprocess.run(
        [sys.executable, str(HERE / "sim_e2e.py"), "--print-commands"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    runs: dict[str, list[str]] = {}
    for line in out.splitlines():
        name, _, cmd = line.partition(": ")
        words = cmd.split()
        if "sloserve.cli" in words:
            runs[name] = words[words.index("sloserve.cli") + 1 :]
    if not runs:
        raise SystemExit(f"sim_e2e.py --print-commands printed no command: {out!r}")
    return runs


def measure(src: Path, args: list[str]) -> dict[str, Any]:
    res = subprocess.run(
        [sys.executable, "-c", _CHILD, str(src), *args],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    if res.returncode:
        raise SystemExit(f"run failed ({src}): {res.stderr.strip().splitlines()[-1:]}")
    parsed: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return parsed


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--runs", default="single,cluster")
    ap.add_argument("--base", type=Path, help="another tree's src/ to compare against")
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--extra",
        default="",
        help="more CLI arguments for every run, e.g. '--no-prefix-caching' (the plain KV "
        "manager, which a trace without prefix identities needs)",
    )
    a = ap.parse_args()
    if a.repeat < 1:
        print("engine_cpu.py: --repeat must be >= 1", file=sys.stderr)
        return 2
    if a.base is not None and not (a.base / "sloserve").is_dir():
        print(f"engine_cpu.py: --base {a.base}: no sloserve package there", file=sys.stderr)
        return 2
    cmds = {name: [*args, *a.extra.split()] for name, args in commands().items()}
    names = [n for n in a.runs.split(",") if n]
    unknown = [n for n in names if n not in cmds]
    if unknown:
        print(
            f"engine_cpu.py: --runs {','.join(unknown)}: not among {sorted(cmds)}", file=sys.stderr
        )
        return 2
    trees = {"base": a.base, "this": SRC} if a.base is not None else {"this": SRC}
    report: dict[str, object] = {"load_average_start": os.getloadavg()}
    for name in names:
        cpu: dict[str, list[float]] = {t: [] for t in trees}
        decisions: dict[str, object] = {}
        summaries: dict[str, object] = {}
        for _ in range(a.repeat):
            for tree, src in trees.items():
                r = measure(src, cmds[name])
                cpu[tree].append(float(r["engine_cpu_s"]))
                decisions[tree] = r["decisions"]
                s = dict(r["summary"])
                s.pop("wall_seconds", None)
                summaries[tree] = s
        row: dict[str, object] = {}
        for tree, xs in cpu.items():
            n = decisions[tree]
            med = statistics.median(xs)
            per = f", {med / n * 1e6:.1f} us/decision" if isinstance(n, int) and n else ""
            print(
                f"{name} [{tree}]: engine CPU median {med:.3f} s "
                f"({min(xs):.3f}-{max(xs):.3f}), {n} decisions{per}"
            )
            row[tree] = {"engine_cpu_s": xs, "decisions": n}
        if "base" in cpu:
            ratios = [t / b for b, t in zip(cpu["base"], cpu["this"], strict=True)]
            same = summaries["base"] == summaries["this"]
            print(
                f"{name}: this/base paired median {statistics.median(ratios):.3f} "
                f"({min(ratios):.3f}-{max(ratios):.3f}); summaries equal: {same}"
            )
            row["paired_ratios"] = ratios
            row["summaries_equal"] = same
        report[name] = row
    report["load_average_end"] = os.getloadavg()
    print(f"load average: {report['load_average_start']} -> {report['load_average_end']}")
    if a.json is not None:
        a.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
