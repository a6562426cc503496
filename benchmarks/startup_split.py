"""Where one ``sim_e2e.py`` run's time goes: imports, workload, engine, table/summary.

Runs one of ``benchmarks/sim_e2e.py``'s commands in this process through the CLI's own
entry point, with timers wrapped around the phases (issue 14's start-up split):

* ``imports``: ``import sloserve.cli`` (what every command pays before it parses flags)
  and the modules the run needs (the runner; the cluster layer for ``cluster``), imported
  here so that the phases below can be timed (``cli_import`` alone: also printed);
* ``workload``: the trace read and the requests built (``workload_of``);
* ``engine``: ``Environment.run`` (the simulation itself);
* ``table+summary``: the request table's columns and the JSON summary;
* ``rest``: everything else after the imports (flag parsing, config, lazy imports of the
  command's own modules, building the instances and the cluster, the JSON output).

Prints CPU seconds (``time.process_time``: the machine is shared, wall time is noisy) and
wall seconds per phase as one JSON line; the interpreter's own start (≈ 20 ms) is not in
it. Run it from the tree to measure (``PYTHONPATH=src``), several times, alternating trees
when comparing: ``python benchmarks/startup_split.py single``.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CPU: dict[str, float] = {}
WALL: dict[str, float] = {}


def _timed(label: str, f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)
    def g(*a: Any, **k: Any) -> Any:
        c, w = time.process_time(), time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            CPU[label] = CPU.get(label, 0.0) + time.process_time() - c
            WALL[label] = WALL.get(label, 0.0) + time.perf_counter() - w

    return g


def _wrap(owner: Any, name: str, label: str) -> None:
    f = getattr(owner, name, None)
    if f is not None:  # older trees name the table and summary functions differently
        setattr(owner, name, _timed(label, f))


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("run", nargs="?", default="single", choices=("single", "cluster"),
                    help="which sim_e2e.py command to split (default: single)")  # fmt: skip
    run = ap.parse_args().run
    c0, w0 = time.process_time(), time.perf_counter()
    import sloserve.cli

    cli_cpu = time.process_time() - c0
    from sloserve.engine.env import Environment
    from sloserve.experiments import runner

    mods: list[Any] = [runner]
    if run == "cluster":
        from sloserve.experiments import cluster_run

        mods.append(cluster_run)
        try:  # the result's assembly moved here in the eighth round (older trees: none)
            from sloserve.experiments import cluster_result

            mods.append(cluster_result)
        except ImportError:
            pass
    CPU["imports"], WALL["imports"] = time.process_time() - c0, time.perf_counter() - w0
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tempfile

    from sim_e2e import commands

    for mod in mods:
        _wrap(mod, "workload_of", "workload")
        for name in ("request_table", "request_columns", "summarize", "summarize_columns"):
            _wrap(mod, name, "table+summary")
    _wrap(Environment, "run", "engine")
    cmd = commands(Path(tempfile.gettempdir()) / "sloserve-bench")[run]
    sys.argv = ["sloserve", *cmd[cmd.index("simulate") :]]
    c1, w1 = time.process_time(), time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        sloserve.cli.main()
    c_rest = time.process_time() - c1 - sum(v for k, v in CPU.items() if k != "imports")
    w_rest = time.perf_counter() - w1 - sum(v for k, v in WALL.items() if k != "imports")
    CPU["rest"], WALL["rest"] = c_rest, w_rest
    out: dict[str, Any] = {"run": run, "cli_import_cpu_s": round(cli_cpu, 3)}
    out.update({f"{k}_cpu_s": round(v, 3) for k, v in CPU.items()})
    out.update({f"{k}_wall_s": round(v, 3) for k, v in WALL.items()})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
