"""A cluster run reads each replica profile's YAML once: the configuration check, the
model registry and the replicas share the run's cached reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sloserve.cluster.config import ClusterConfig
from sloserve.core.errors import ConfigError
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


_BOOL = "expected a number, not the boolean true (YAML reads yes/no/on/off as booleans)"


@pytest.mark.parametrize(
    ("line", "value", "message"),
    [
        (
            "  num_layers: ",
            "yes",
            "field model.num_layers: " + _BOOL,
        ),
        ("  memory_gib: ", ".inf", "field gpu.memory_gib: must be a finite number"),
        ("  memory_gib: ", ".nan", "field gpu.memory_gib: must be a finite number"),
        ("tp: ", "on", "field tp: " + _BOOL),
        ("description: ", "2024-13-45", "not valid YAML (bad value: month must be in 1..12)"),
    ],
)
def test_profile_values_yaml_misreads_are_refused(
    tmp_path: Path, line: str, value: str, message: str
) -> None:
    src = (Path(profile_mod.__file__).parent / "profiles" / "llama-2-7b-a100.yaml").read_text()
    lines = src.splitlines()
    hits = [i for i, s in enumerate(lines) if s.startswith(line)]
    assert len(hits) == 1, line
    lines[hits[0]] = line + value
    bad = tmp_path / "bad.yaml"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as err:
        profile_mod.load_profile_file(bad)
    assert str(err.value) == f"{bad}: {message}"
