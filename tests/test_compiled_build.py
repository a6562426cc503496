"""The opt-in compiled build (``SLOSERVE_COMPILE=1 pip install .``): what keeps it valid.

mypyc compiles the modules ``setup.py`` lists into classes that Python code cannot
subclass (unless a class says so) and that cannot bind a plain function as a method.
CI runs the pure-Python install, so these checks read the source: a change that would
break only the compiled build fails here. (Results are checked by running the whole
suite against a compiled install: docs/contributing.md.)
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def _compiled_paths() -> list[str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "COMPILED" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, list)
            return [str(v) for v in value]
    raise AssertionError("setup.py has no COMPILED list")


def _open_to_subclasses(cls: ast.ClassDef) -> bool:
    for dec in cls.decorator_list:
        if (
            isinstance(dec, ast.Call)
            and getattr(dec.func, "id", getattr(dec.func, "attr", "")) == "mypyc_attr"
        ):
            kws = {k.arg: k.value for k in dec.keywords}
            flag = kws.get("allow_interpreted_subclasses") or kws.get("native_class")
            if isinstance(flag, ast.Constant):
                return bool(flag.value) != ("native_class" in kws)
    return False


def _closed_classes() -> dict[str, str]:
    """Classes of the compiled modules that Python code may not subclass: name → module."""
    closed: dict[str, str] = {}
    for rel in _compiled_paths():
        tree = ast.parse((SRC / rel).read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not _open_to_subclasses(node):
                closed[node.name] = rel
    return closed


def test_the_compiled_list_names_modules_that_exist() -> None:
    paths = _compiled_paths()
    assert paths and len(set(paths)) == len(paths)
    missing = [p for p in paths if not (SRC / p).is_file()]
    assert not missing, f"setup.py's COMPILED names missing modules: {missing}"


def _base_names(cls: ast.ClassDef) -> list[str]:
    names = []
    for b in cls.bases:
        if isinstance(b, ast.Name):
            names.append(b.id)
        elif isinstance(b, ast.Attribute):
            names.append(b.attr)
    return names


def test_no_python_class_subclasses_a_closed_compiled_class() -> None:
    closed = _closed_classes()
    compiled = set(_compiled_paths())
    offenders = []
    for root in (SRC, ROOT / "tests", ROOT / "benchmarks"):
        for path in sorted(root.rglob("*.py")):
            rel = str(path.relative_to(SRC)) if root == SRC else None
            if rel in compiled:
                continue  # compiled together: mypyc allows it
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    hit = [b for b in _base_names(node) if b in closed]
                    if hit:
                        offenders.append(f"{path.relative_to(ROOT)}: {node.name}({hit[0]})")
    assert not offenders, (
        "these Python classes subclass a compiled class that does not allow it (mark the "
        f"base @mypyc_attr(allow_interpreted_subclasses=True) or leave it out): {offenders}"
    )


def test_a_closed_compiled_class_is_found() -> None:
    """The check above can fail: the engine's Instance is one of the closed classes."""
    assert _closed_classes().get("Instance") == "sloserve/engine/instance.py"
    assert "PagedKVManager" not in _closed_classes()  # an extension point: open


def test_compiled_classes_bind_no_function_as_an_attribute() -> None:
    """``method = module.function`` in a class body binds as a method in Python but not in
    a compiled class (a call then misses ``self``): compiled modules define methods."""
    offenders = []
    for rel in _compiled_paths():
        for node in ast.walk(ast.parse((SRC / rel).read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            for stmt in node.body:
                if not isinstance(stmt, ast.Assign):
                    continue
                values = stmt.value.elts if isinstance(stmt.value, ast.Tuple) else [stmt.value]
                if any(isinstance(v, ast.Name | ast.Attribute) for v in values):
                    offenders.append(f"{rel}:{stmt.lineno}")  # (__slots__ hold strings)
    assert not offenders, f"class-body aliases in compiled modules: {offenders}"


def _backend() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "sloserve_build_under_test", ROOT / "build_backend" / "sloserve_build.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_backend_asks_for_mypyc_only_when_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = _backend()
    monkeypatch.chdir(ROOT)  # setuptools runs ./setup.py to collect requirements
    monkeypatch.setattr(sys, "argv", ["setup.py"])
    monkeypatch.delenv("SLOSERVE_COMPILE", raising=False)
    plain = backend.get_requires_for_build_wheel()
    assert not any(r.startswith("mypy") for r in plain)
    monkeypatch.setenv("SLOSERVE_COMPILE", "1")
    compiling = backend.get_requires_for_build_wheel()
    assert any(r.startswith("mypy") for r in compiling)
    assert any(r.startswith("numpy") for r in compiling)


def test_an_editable_build_never_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = _backend()
    seen: dict[str, Any] = {}

    def editable(*args: Any, **kwargs: Any) -> str:
        import os

        seen["compile"] = os.environ.get("SLOSERVE_COMPILE")
        return "sloserve.whl"

    monkeypatch.setattr(backend._setuptools, "build_editable", editable)
    monkeypatch.setenv("SLOSERVE_COMPILE", "1")
    assert backend.build_editable("dist") == "sloserve.whl"
    assert seen["compile"] == "0"


def test_the_pure_python_only_tests_exist() -> None:
    """conftest's skip list names real tests (a renamed test would silently stay listed)."""
    from conftest import PURE_PYTHON_ONLY

    for entry in PURE_PYTHON_ONLY:
        file, func = entry.split("::")
        tree = ast.parse((ROOT / "tests" / file).read_text())
        names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert func in names, f"conftest.PURE_PYTHON_ONLY names a missing test: {entry}"
