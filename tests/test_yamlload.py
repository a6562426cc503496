"""The libyaml fast path reads every built-in data file exactly as safe_load does."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

import sloserve.costmodel
from sloserve.core import yamlload

_PKG = Path(sloserve.costmodel.__file__).parent
_FILES = sorted(_PKG.glob("profiles/*.yaml")) + sorted(_PKG.glob("specs/*.yaml"))


def _same(a: Any, b: Any) -> bool:
    """Equal with matching types all the way down (1 vs 1.0 vs True differ)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def test_built_in_files_found() -> None:
    assert len(_FILES) >= 20
    assert any(p.name == "models.yaml" for p in _FILES)


@pytest.mark.parametrize("path", _FILES, ids=lambda p: p.name)
def test_same_data_as_safe_load(path: Path) -> None:
    text = path.read_text()
    assert _same(yamlload.safe_load(text), yaml.safe_load(text))


def test_same_error_as_safe_load() -> None:
    bad = "a: [1, 2\nb: 3\n"
    with pytest.raises(yaml.YAMLError) as pure:
        yaml.safe_load(bad)
    with pytest.raises(yaml.YAMLError) as fast:
        yamlload.safe_load(bad)
    assert str(fast.value) == str(pure.value)


def test_pure_fallback_without_libyaml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(yamlload, "_FAST_LOADER", None)
    text = (_PKG / "specs" / "gpus.yaml").read_text()
    assert _same(yamlload.safe_load(text), yaml.safe_load(text))


def test_same_scalars_as_safe_load() -> None:
    text = "x: 1e3\ny: 0x10\nz: yes\nw: ~\nd: 2024-01-02\nf: .inf\nn: 007\n"
    assert _same(yamlload.safe_load(text), yaml.safe_load(text))
