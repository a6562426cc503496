"""sloserve's build backend: setuptools', plus an opt-in compiled build of the engine.

``SLOSERVE_COMPILE=1 pip install .`` compiles the simulator's per-iteration modules
(``setup.py`` lists them) to C extensions with mypyc, the compiler mypy ships for code
that is already fully typed, as mypy and black compile themselves: the same source, the
same results, a faster inner loop (docs/install.md, "The compiled build"). Without the
variable, or for an editable install, the package is pure Python and this backend is
setuptools' own.

Only two hooks differ: a wheel build asks for mypy when compiling, and an editable build
never compiles (a stale extension module beside its edited ``.py`` would shadow it: the
import system prefers the extension).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (every hook not overridden below)

MYPYC_REQUIREMENTS = ("mypy>=1.10", "numpy>=1.24")
"""What a compiling build adds: mypyc, and numpy's types (the engine's arrays; without
them the compiled code treats numpy values as untyped objects)."""


def compiling() -> bool:
    """Whether this build compiles (``SLOSERVE_COMPILE=1``)."""
    return os.environ.get("SLOSERVE_COMPILE", "").strip() == "1"


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    if not compiling():
        return list(_setuptools.get_requires_for_build_wheel(config_settings))
    # setuptools runs setup.py to collect its requirements, before mypy is installed:
    # that run must not compile.
    os.environ["SLOSERVE_COMPILE"] = "0"
    try:
        requires = list(_setuptools.get_requires_for_build_wheel(config_settings))
    finally:
        os.environ["SLOSERVE_COMPILE"] = "1"
    return [*requires, *MYPYC_REQUIREMENTS]


def build_editable(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    if compiling():
        print(
            "sloserve: SLOSERVE_COMPILE=1 is ignored for an editable install (an extension "
            "module would shadow the .py files you edit); install with `pip install .`",
            file=sys.stderr,
        )
        os.environ["SLOSERVE_COMPILE"] = "0"
    return str(_setuptools.build_editable(wheel_directory, config_settings, metadata_directory))
