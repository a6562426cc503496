"""Prefix caching from the command line and YAML: the native switch, vLLM's spelling
(flag and engine argument), the CPU tier's size, and the one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cli_helpers import assert_user_error, run_main, write
from sloserve.cli._app import _build_config
from sloserve.core.errors import ConfigError


def cfg(flags: dict[str, Any], config: Path | None = None) -> Any:
    return _build_config({}, config, flags)[0]


def test_on_by_default_and_vllms_names_are_the_same_switch(tmp_path: Path) -> None:
    assert cfg({}).instance.prefix_caching is True
    assert cfg({"prefix_caching": False}).instance.prefix_caching is False
    assert cfg({"enable_prefix_caching": False}) == cfg({"prefix_caching": False})
    assert cfg({"cpu_cache_gib": 8.0}).instance.cpu_cache_gib == 8.0
    with pytest.raises(ConfigError, match="contradicts"):
        cfg({"enable_prefix_caching": False, "prefix_caching": True})
    engine = write(tmp_path / "e.yaml", "engine: {enable-prefix-caching: false}\n")
    native = write(tmp_path / "n.yaml", "instance: {prefix_caching: false, cpu_cache_gib: 2}\n")
    assert cfg({}, engine).instance.prefix_caching is False
    assert cfg({}, native).instance.cpu_cache_gib == 2


def test_bad_values_are_one_line_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    res = run_main(monkeypatch, capsys, "simulate", "--cpu-cache-gib", "-1", "--num-requests", "2")
    assert_user_error(res, "--cpu-cache-gib")
    bad = write(tmp_path / "b.yaml", "instance: {prefix_caching: maybe}\n")
    res = run_main(monkeypatch, capsys, "simulate", "--config", str(bad))
    assert_user_error(res, "prefix_caching")


TRACE = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"


@pytest.mark.skipif(
    not (TRACE / "mooncake_conversation_trace.jsonl").exists(), reason="no shared traces"
)
def test_simulate_reports_the_hit_rate_and_the_switch_turns_it_off(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import json

    base = [
        "simulate",
        "--trace",
        str(TRACE / "mooncake_conversation_trace.jsonl"),
        "--window-end",
        "15",
        "--profile",
        "llama-3.1-8b@h100",
        "--policy",
        "sarathi",
    ]
    on = run_main(monkeypatch, capsys, *base, "--out", str(tmp_path / "on"))
    off = run_main(
        monkeypatch, capsys, *base, "--no-enable-prefix-caching", "--out", str(tmp_path / "off")
    )
    assert on.returncode == off.returncode == 0, on.stderr + off.stderr
    assert "prefix hit" in on.stdout
    s_on = json.loads((tmp_path / "on" / "summary.json").read_text())["sarathi"]
    s_off = json.loads((tmp_path / "off" / "summary.json").read_text())["sarathi"]
    assert s_on["prefix_caching"] and not s_off["prefix_caching"]
    assert s_on["prefill_tokens_saved"] > 0 == s_off["prefill_tokens_saved"]
