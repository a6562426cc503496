"""The public API: every name in ``sloserve.__all__`` resolves, is documented, and the
documented examples run; ``import sloserve`` stays cheap."""

from __future__ import annotations

import doctest
import subprocess
import sys
from pathlib import Path

import pytest

import sloserve
import sloserve.api
from sloserve.core.errors import ConfigError


def test_every_public_name_resolves_and_has_a_docstring() -> None:
    assert sloserve.__all__ == sorted(sloserve._EXPORTS)
    for name in sloserve.__all__:
        obj = getattr(sloserve, name)
        assert (obj.__doc__ or "").strip(), f"sloserve.{name} has no docstring"
    assert "simulate" in dir(sloserve)
    with pytest.raises(AttributeError):
        _ = sloserve.not_a_name  # type: ignore[attr-defined]


@pytest.mark.parametrize("module", [sloserve, sloserve.api])
def test_docstring_examples_run(module: object) -> None:
    failed, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)  # type: ignore[arg-type]
    assert tried > 0 and failed == 0


def test_import_is_cheap() -> None:
    code = (
        "import sys, sloserve; heavy = {'pandas', 'fastapi', 'ortools', 'torch', 'ray'};"
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_config_forms_agree_and_runs_are_deterministic(tmp_path: Path) -> None:
    data = {"policy": "vllm", "workload": {"duration_s": 8, "seed": 3}}
    yaml_path = tmp_path / "run.yaml"
    yaml_path.write_text("policy: vllm\nworkload: {duration_s: 8, seed: 3}\n")
    a = sloserve.simulate(data).summary
    b = sloserve.simulate(yaml_path).summary
    c = sloserve.simulate(sloserve.SimConfig.model_validate(data)).summary
    for s in (a, b, c):
        s.pop("wall_seconds")
    assert a == b == c
    assert a["finished"] > 0


def test_overrides_replace_top_level_fields() -> None:
    cfg = sloserve.load_config({"policy": "vllm"}, policy="sarathi", horizon_s=5)
    assert (cfg.policy, cfg.horizon_s) == ("sarathi", 5)


def test_bad_config_is_a_typed_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config: instance.max_running: .*got 0"):
        sloserve.simulate({"instance": {"max_running": 0}})
    with pytest.raises(ConfigError, match="unknown key 'polcy'"):
        sloserve.simulate({"polcy": "vllm"})
    with pytest.raises(ConfigError, match="config file not found"):
        sloserve.simulate(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not int"):
        sloserve.load_config(3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="policy listed twice"):
        sloserve.compare({"workload": {"duration_s": 5}}, ["vllm", "vllm"])


class _Fcfs(sloserve.Scheduler):
    """First come, first served: whole prompts, then one token per step; never preempts."""

    name = "test-public-api-fcfs"
    chunked_prefill = False

    def schedule(self, view: sloserve.InstanceView) -> sloserve.SchedulerOutput:
        batch, tokens, blocks = [], 0, 0
        for r in [*view.running, *view.waiting]:
            need = r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens
            blocks += view.kv.blocks_needed(r.req_id, need)
            if (
                len(batch) == view.limits.max_running
                or tokens + need > view.limits.max_batch_tokens
                or blocks > view.kv.num_free_blocks
            ):
                break
            batch.append(sloserve.ScheduledRequest(r, need))
            tokens += need
        return sloserve.SchedulerOutput(batch=tuple(batch))


def test_a_registered_policy_runs_by_name() -> None:
    if _Fcfs.name not in sloserve.policy_names():
        sloserve.register_policy(_Fcfs.name, lambda params: _Fcfs(), "test FCFS")
    res = sloserve.simulate({"workload": {"duration_s": 5}}, policy=_Fcfs.name)
    assert res.summary["policy"] == _Fcfs.name
    assert res.summary["finished"] == len(res.table) > 0
    with pytest.raises(ConfigError, match="already registered"):
        sloserve.register_policy(_Fcfs.name, lambda params: _Fcfs(), "again")
