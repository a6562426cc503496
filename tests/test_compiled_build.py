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


def _closed_classes() -> dict[str, str]:
    """Classes of the compiled modules (Python code may not subclass them): name → module."""
    closed: dict[str, str] = {}
    for rel in _compiled_paths():
        tree = ast.parse((SRC / rel).read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                closed[node.name] = rel
    return closed


def test_the_compiled_list_names_modules_that_exist() -> None:
    paths = _compiled_paths()
    assert paths and len(set(paths)) == len(paths)
    missing = [p for p in paths if not (SRC / p).is_file()]
    assert not missing, f"setup.py's COMPILED names missing modules: {missing}"


def _module_of(rel: str) -> str:
    return rel.removesuffix(".py").replace("/", ".")


def _compiled_names(tree: ast.Module, compiled: dict[str, str]) -> dict[str, str]:
    """What a file's imports bind to a compiled module or one of its classes: local name
    → ``module`` or ``module:Class`` (``compiled``: module → its path)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                local = a.asname or a.name
                if node.module in compiled:  # from sloserve.engine.env import Environment
                    names[local] = f"{node.module}:{a.name}"
                elif f"{node.module}.{a.name}" in compiled:  # from sloserve.engine import env
                    names[local] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in compiled and a.asname:  # import sloserve.engine.env as env
                    names[a.asname] = a.name
    return names


def _resolve(expr: ast.expr, names: dict[str, str]) -> str | None:
    """``module:Class`` for a base class expression naming a compiled module's class."""
    if isinstance(expr, ast.Name):
        target = names.get(expr.id)
        return target if target and ":" in target else None
    if isinstance(expr, ast.Attribute):
        if isinstance(expr.value, ast.Name) and expr.value.id in names:
            mod = names[expr.value.id]
            return f"{mod}:{expr.attr}" if ":" not in mod else None
        dotted = ast.unparse(expr.value)
        return f"{dotted}:{expr.attr}"
    return None


def test_no_python_class_subclasses_a_closed_compiled_class() -> None:
    compiled = {_module_of(rel): rel for rel in _compiled_paths()}
    closed = {f"{_module_of(rel)}:{name}" for name, rel in _closed_classes().items()}
    offenders = []
    for root in (SRC, ROOT / "tests", ROOT / "benchmarks"):
        for path in sorted(root.rglob("*.py")):
            if root == SRC and str(path.relative_to(SRC)) in compiled.values():
                continue  # compiled together: mypyc allows it
            tree = ast.parse(path.read_text())
            names = _compiled_names(tree, compiled)
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    hit = [t for b in node.bases if (t := _resolve(b, names)) in closed]
                    if hit:
                        offenders.append(f"{path.relative_to(ROOT)}: {node.name}({hit[0]})")
    assert not offenders, (
        "these Python classes subclass a compiled class (mypyc forbids it: leave that "
        f"module out of setup.py's COMPILED): {offenders}"
    )


def test_monkeypatched_compiled_functions_are_pure_python_only() -> None:
    """A test replacing a function of a compiled module tests nothing in the compiled
    build (compiled callers call the original): conftest must skip it there."""
    from conftest import PURE_PYTHON_ONLY

    compiled = {_module_of(rel): rel for rel in _compiled_paths()}
    functions = {
        mod: {
            n.name
            for n in ast.parse((SRC / rel).read_text()).body
            if isinstance(n, ast.FunctionDef)
        }
        for mod, rel in compiled.items()
    }
    unlisted = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        names = _compiled_names(tree, compiled)
        for test in tree.body:
            if not isinstance(test, ast.FunctionDef):
                continue
            for call in ast.walk(test):
                if not (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "setattr"
                    and call.args
                ):
                    continue
                first = call.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    mod, _, attr = first.value.rpartition(".")
                    hits = any(
                        (mod == m or mod.startswith(f"{m}.")) and attr in functions[m]
                        for m in compiled
                    )
                elif isinstance(first, ast.Name) and first.id in names and len(call.args) > 1:
                    mod = names[first.id]
                    attr_node = call.args[1]
                    hits = (
                        ":" not in mod
                        and isinstance(attr_node, ast.Constant)
                        and attr_node.value in functions[mod]
                    )
                else:
                    hits = False
                if hits and f"{path.name}::{test.name}" not in PURE_PYTHON_ONLY:
                    unlisted.append(f"{path.name}::{test.name}")
    assert not unlisted, f"add these to conftest.PURE_PYTHON_ONLY: {sorted(set(unlisted))}"


def test_a_closed_compiled_class_is_found() -> None:
    """The checks above can fail: the engine's Instance is closed, and an aliased import of
    a compiled class resolves to it."""
    assert _closed_classes().get("Instance") == "sloserve/engine/instance.py"
    assert "PagedKVManager" not in _closed_classes()  # an extension point: not compiled
    assert "LinearCostModel" not in _closed_classes()  # (its kernels are: run_kernels.py)
    compiled = {_module_of(rel): rel for rel in _compiled_paths()}
    tree = ast.parse(
        "from sloserve.engine.env import Environment as E\n"
        "from sloserve.engine import instance\n"
        "class A(E): pass\nclass B(instance.Instance): pass\nclass C(Run): pass\n"
    )
    names = _compiled_names(tree, compiled)
    bases = [_resolve(c.bases[0], names) for c in tree.body if isinstance(c, ast.ClassDef)]
    assert bases == ["sloserve.engine.env:Environment", "sloserve.engine.instance:Instance", None]


def _kernel_problems(compiled: list[str], sources: dict[str, str], setup_src: str) -> list[str]:
    """What breaks the kernel rules (``sources``: path under src/ → text of each
    ``*_kernels.py``)."""
    problems = [f"{rel} is not in setup.py's COMPILED" for rel in sources if rel not in compiled]
    for rel, text in sources.items():
        problems += [
            f"{rel}:{node.lineno} defines class {node.name}"
            for node in ast.parse(text).body
            if isinstance(node, ast.ClassDef)
        ]
    flags = [
        n.value
        for n in ast.walk(ast.parse(setup_src))
        if isinstance(n, ast.Constant) and n.value == "-ffp-contract=off"
    ]  # (in the code: a comment or docstring naming the flag does not count)
    if not flags:
        problems.append("setup.py no longer turns off floating-point contraction")
    return problems


def test_kernel_modules_are_compiled_plain_functions() -> None:
    """An extension point's hot loop lives in a ``*_kernels.py`` module of plain functions
    (docs/contributing.md): compiled (else it is a Python call for nothing), with no class
    to subclass or close, and built without fused multiply-adds (results stay the
    interpreter's, bit for bit). The check fails on a break of each rule."""
    sources = {str(p.relative_to(SRC)): p.read_text() for p in sorted(SRC.rglob("*_kernels.py"))}
    assert {"sloserve/engine/kv_kernels.py", "sloserve/costmodel/run_kernels.py"} <= set(sources)
    setup_src = (ROOT / "setup.py").read_text()
    assert _kernel_problems(_compiled_paths(), sources, setup_src) == []
    rel = "sloserve/engine/kv_kernels.py"
    broken = {**sources, rel: sources[rel] + "\nclass Grower:\n    pass\n"}
    unlisted = [p for p in _compiled_paths() if p != rel]
    assert len(_kernel_problems(unlisted, broken, setup_src.replace("-ffp-contract=off", ""))) == 3


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


def test_the_sdist_carries_the_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An sdist without build_backend/ cannot be built (pyproject names it)."""
    import tarfile

    backend = _backend()
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["setup.py"])
    name = backend.build_sdist(str(tmp_path))
    with tarfile.open(tmp_path / name) as tar:
        members = {m.split("/", 1)[1] for m in tar.getnames() if "/" in m}
    assert {"build_backend/sloserve_build.py", "setup.py", "pyproject.toml"} <= members


def test_sdist_requirements_never_need_mypyc(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = _backend()
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["setup.py"])
    monkeypatch.setitem(sys.modules, "mypyc", None)  # not installed: importing it fails
    monkeypatch.setitem(sys.modules, "mypyc.build", None)
    monkeypatch.setenv("SLOSERVE_COMPILE", "1")
    assert not any(r.startswith("mypy") for r in backend.get_requires_for_build_sdist())


# The compiled engine reads declared types strictly: what reaches it must be what the
# annotations say, in both builds alike (these run in the pure-Python install too).


def test_numpy_integers_become_ints_in_a_request() -> None:
    import numpy as np

    from sloserve.core.request import Request

    r = Request(
        np.int64(3), 0.5, np.int32(40), np.int64(7), priority=np.int8(1), max_tokens=np.int64(9)
    )  # type: ignore[arg-type]
    values = (r.req_id, r.num_prompt_tokens, r.true_output_len, r.priority, r.max_tokens)
    assert values == (3, 40, 7, 1, 9)
    assert all(type(v) is int for v in values)
    with pytest.raises(TypeError):
        Request(1, 0.0, 2.5, 3)  # type: ignore[arg-type]  # a float is no token count


def test_scheduler_output_keeps_tuples_all_the_way_down() -> None:
    from sloserve.core.request import Request
    from sloserve.engine.interface import PreemptionMode, ScheduledRequest, SchedulerOutput

    r = Request(1, 0.0, 4, 2)
    mode = next(iter(PreemptionMode))
    out = SchedulerOutput([ScheduledRequest(r, 1)], [[r, mode]], [r])  # type: ignore[arg-type]
    assert type(out.batch) is tuple and type(out.swap_in) is tuple
    assert out.preempt == ((r, mode),) and type(out.preempt[0]) is tuple


def test_a_batch_entry_of_the_wrong_type_is_a_scheduler_violation() -> None:
    from helpers import make_instance, req, run, small_linear_cost
    from sloserve.core.errors import SchedulerViolation
    from sloserve.engine.interface import ScheduledRequest, Scheduler, SchedulerOutput
    from sloserve.policies.registry import make_policy

    class Sloppy(Scheduler):
        name = "sloppy"

        def __init__(self) -> None:
            self.inner = make_policy("vllm")
            self.default_prefill_tokens = self.inner.default_prefill_tokens
            self.chunked_prefill = self.inner.chunked_prefill

        def max_sequence_tokens(self, limits):  # type: ignore[no-untyped-def]
            return self.inner.max_sequence_tokens(limits)

        def schedule(self, view):  # type: ignore[no-untyped-def]
            out = self.inner.schedule(view)
            batch = tuple(ScheduledRequest(r, str(n)) for r, n in out.batch)  # type: ignore[arg-type]
            return SchedulerOutput(batch, out.preempt, out.swap_in)

    inst = make_instance(Sloppy(), cost=small_linear_cost(), block_size=4, M=4000)
    inst.debug_checks = False
    with pytest.raises(SchedulerViolation, match="output types"):
        run(inst, [req(i, 0.1 * i, 12, 4) for i in range(3)])
