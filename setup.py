"""Extension modules of the opt-in compiled build (``SLOSERVE_COMPILE=1 pip install .``).

Everything else about the package is in pyproject.toml; build_backend/sloserve_build.py
says when this compiles. The list is the engine's per-decision path, the modules
``benchmarks/engine_calls.py`` times. A module belongs here only if nothing outside it
subclasses its classes (mypyc's classes are closed to Python subclasses, and its
``allow_interpreted_subclasses`` escape has known bugs with overridden attributes and
properties): the KV managers (``engine/kv.py``, an extension point) and the policies stay
Python; the paged manager's and the linear cost model's hot arithmetic is in kernel modules
of plain functions (``engine/kv_kernels.py``, ``costmodel/run_kernels.py``) that they call
and this list compiles; the prefix cache's prompt keys and the routers' peek at every
replica (``engine/prefix_keys.py``, ``engine/prefix_peek.py``) are plain functions too.
``tests/test_compiled_build.py`` checks this.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig

from setuptools import setup

COMPILED = [
    "sloserve/costmodel/run_kernels.py",
    "sloserve/engine/checks.py",
    "sloserve/engine/chunk_run.py",
    "sloserve/engine/continuation.py",
    "sloserve/engine/decode_run.py",
    "sloserve/engine/env.py",
    "sloserve/engine/fastpath.py",
    "sloserve/engine/filling.py",
    "sloserve/engine/instance.py",
    "sloserve/engine/kv_kernels.py",
    "sloserve/engine/prefix_keys.py",
    "sloserve/engine/prefix_peek.py",
    "sloserve/engine/retire.py",
    "sloserve/engine/teardown.py",
    "sloserve/engine/thrash.py",
]

COMPILING = os.environ.get("SLOSERVE_COMPILE", "").strip() == "1"

ext_modules = []
if COMPILING:
    # Say at once what is missing, not after minutes of type checking.
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    compiler = os.environ.get("CC", compiler).split()[0]
    headers = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    if shutil.which(compiler) is None or not os.path.isfile(headers):
        sys.exit(
            f"sloserve: SLOSERVE_COMPILE=1 needs a C compiler ({compiler!r}: "
            f"{'found' if shutil.which(compiler) else 'not found'}) and the Python headers "
            f"({headers}: {'found' if os.path.isfile(headers) else 'not found'}); unset "
            "SLOSERVE_COMPILE for the pure-Python install"
        )
    from mypyc.build import mypycify

    # The type check that guides compilation needs no third-party stubs (mypy's own run
    # in CI checks the whole package strictly): the isolated build has mypy and numpy.
    flags = ["--config-file=", "--ignore-missing-imports", "--follow-imports=silent"]
    ext_modules = mypycify([*flags, *(f"src/{m}" for m in COMPILED)], opt_level="3")
    if sys.platform != "win32":  # (MSVC 2022 and later: /fp:contract is off by default)
        # Results must equal the interpreter's: no multiply and add fused into one
        # rounding (GCC fuses by default where the target has FMA, e.g. -march=native).
        for ext in ext_modules:
            ext.extra_compile_args = [*ext.extra_compile_args, "-ffp-contract=off"]

# One build folder per kind: a pure build must never pick up a compiled build's extension
# modules left in a shared build/lib (the wheel would then ship stale compiled code).
setup(
    ext_modules=ext_modules,
    options={"build": {"build_base": "build/compiled" if COMPILING else "build/pure"}},
)
