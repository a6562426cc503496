"""Aladdin's and QLM's routers register lazily (``cluster/routing.py``'s ``_LAZY``): a run
with another router never imports their packages, and every name still works from a fresh
interpreter. Each check runs in its own interpreter (the test process has imported them)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def run(code: str) -> str:
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC},
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_another_router_imports_neither_package() -> None:
    out = run(
        """
        import sys
        from sloserve.cluster.config import ClusterConfig
        from sloserve.experiments.cluster_run import simulate_cluster
        from sloserve.experiments.runner import SimConfig
        from sloserve.workloads.spec import WorkloadSpec
        cfg = SimConfig(workload=WorkloadSpec(num_requests=20, duration_s=None))
        res = simulate_cluster(
            cfg, ClusterConfig.model_validate({"replicas": [{"count": 2}],
                                              "router": "least-outstanding"}))
        assert res.summary["finished"] == 20
        print(sorted(m for m in sys.modules
                     if m.startswith(("sloserve.cluster.qlm", "sloserve.cluster.aladdin"))))
        """
    )
    assert out == "[]"


def test_the_lazy_names_are_exactly_what_the_packages_register() -> None:
    out = run(
        """
        import importlib
        from sloserve.cluster import routing
        before = set(routing._ROUTERS)
        assert not before & set(routing._LAZY), before & set(routing._LAZY)
        for p in set(routing._LAZY.values()):
            importlib.import_module(p)
        print(sorted(set(routing._ROUTERS) - before) == sorted(routing._LAZY))
        """
    )
    assert out == "True"


def test_each_lazy_name_works_from_a_fresh_interpreter() -> None:
    out = run(
        """
        from sloserve.cluster import routing
        from sloserve.cluster.routing import make_router, router_names
        names = sorted(routing._LAZY)
        print(all(make_router(n).name is not None for n in names))
        print(set(names) <= set(router_names()))
        """
    )
    assert out.split() == ["True", "True"]


def test_a_lazy_name_is_taken_before_its_package_is_imported() -> None:
    out = run(
        """
        from sloserve.core.errors import ConfigError
        from sloserve.cluster.routing import register_router, make_router
        try:
            register_router("aladdin", lambda seed: None, "mine")
        except ConfigError as e:
            print("refused:", e)
        print(type(make_router("aladdin")).__name__)
        """
    )
    assert "refused: router 'aladdin' is already registered" in out
    assert out.endswith("AladdinRouter")
