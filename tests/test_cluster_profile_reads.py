"""A cluster run reads each replica profile's YAML once: the configuration check, the
model registry and the replicas share the run's cached reader."""

from __future__ import annotations

from typing import Any

import pytest

from sloserve.cluster.config import ClusterConfig
from sloserve.costmodel import profile as profile_mod
from sloserve.experiments.cluster_run import simulate_cluster
from sloserve.experiments.runner import SimConfig


def test_each_profile_is_read_once_per_cluster_run(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []
    real = profile_mod.load_profile_file

    def counted(path: Any) -> Any:
        reads.append(str(path))
        return real(path)

    monkeypatch.setattr(profile_mod, "load_profile_file", counted)
    cfg = SimConfig.model_validate(
        {
            "policy": "sarathi",
            "workload": {"mix": "sharegpt", "num_requests": 40, "duration_s": None, "seed": 1},
        }
    )
    cluster = ClusterConfig.model_validate(
        {"replicas": [{"count": 3}], "router": "least-outstanding"}
    )
    res = simulate_cluster(cfg, cluster)
    assert res.summary["finished"] == 40
    assert len(reads) == 1 and len(set(reads)) == 1
