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


@pytest.mark.parametrize(
    "text",
    ["a:\t1\n", "a: 1\t# c\n", "a: [1,\t2]\n", "a: 1\t\n", "a\t: 1\n"],
    ids=["sep", "comment", "flow", "trailing", "key"],
)
def test_tab_separators_read_as_the_pure_parser_does(text: str) -> None:
    # libyaml accepts these; the pure parser rejects them: a file must not load on one
    # install and fail on another.
    with pytest.raises(yaml.YAMLError) as pure:
        yaml.safe_load(text)
    with pytest.raises(yaml.YAMLError) as fast:
        yamlload.safe_load(text)
    assert str(fast.value) == str(pure.value)


def test_inner_byte_order_mark_reads_as_the_pure_parser_does() -> None:
    text = "a:\n  b: 1\n\ufeff c: 2\n"
    assert yamlload.safe_load(text) == yaml.safe_load(text) == {"a": {"b": 1}, "\ufeff c": 2}


@pytest.mark.parametrize("fast", [True, False], ids=["libyaml", "pure"])
@pytest.mark.parametrize(
    ("text", "problem"),
    [("d: 2024-13-45\n", "bad value: month must be in 1..12"), ("[" * 3000, "nested too deeply")],
    ids=["date", "deep"],
)
def test_values_python_cannot_build_are_yaml_errors(
    monkeypatch: pytest.MonkeyPatch, fast: bool, text: str, problem: str
) -> None:
    if not fast:
        monkeypatch.setattr(yamlload, "_FAST_LOADER", None)
    with pytest.raises(yamlload.YAMLValueError) as err:
        yamlload.safe_load(text)
    assert isinstance(err.value, yaml.YAMLError)
    assert err.value.problem == problem
