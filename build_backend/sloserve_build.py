"""sloserve's build backend: setuptools', plus an opt-in compiled build of the engine.

``SLOSERVE_COMPILE=1 pip install .`` compiles the simulator's per-decision modules
(``setup.py`` lists them) to C extensions with mypyc, the compiler mypy ships for code
that is already fully typed, as mypy and black compile themselves: the same source, the
same results, a faster inner loop (docs/getting-started.md, "The compiled build").
Without the variable the package is pure Python and this backend is setuptools' own.

Only a wheel's build compiles. Every other hook (requirements, metadata, sdist, and the
whole editable install) runs setup.py with compiling off: metadata does not depend on it,
mypy is not installed yet when setuptools collects requirements, and in an editable
install a compiled module beside its ``.py`` file would shadow the file being edited (the
import system prefers the extension).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (the hooks not overridden below)

MYPYC_REQUIREMENTS = ("mypy>=2.4.1,<2.5", "numpy>=1.24")
"""What a compiling build adds: mypyc, pinned to the release the compiled build was
tested with (a new mypyc may compile the engine differently, and CI never compiles), and
numpy's types (without them the compiled code treats numpy values as untyped objects)."""

_VAR = "SLOSERVE_COMPILE"
T = TypeVar("T")


def compiling() -> bool:
    """Whether this build compiles (``SLOSERVE_COMPILE=1``)."""
    return os.environ.get(_VAR, "").strip() == "1"


def _in_pure(hook: Callable[..., T], *args: Any) -> T:
    """Run a setuptools hook with compiling off, then restore the variable."""
    old = os.environ.get(_VAR)
    os.environ[_VAR] = "0"
    try:
        return hook(*args)
    finally:
        if old is None:
            del os.environ[_VAR]
        else:
            os.environ[_VAR] = old


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    requires = list(_in_pure(_setuptools.get_requires_for_build_wheel, config_settings))
    return [*requires, *MYPYC_REQUIREMENTS] if compiling() else requires


def build_wheel(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    # setuptools copies whatever its build folder holds into the wheel: an extension
    # module left by an earlier build (a module since dropped from setup.py's list, or
    # since edited) would ship and shadow its .py file. Each wheel starts from an empty one.
    shutil.rmtree(os.path.join("build", "compiled" if compiling() else "pure"), ignore_errors=True)
    return str(_setuptools.build_wheel(wheel_directory, config_settings, metadata_directory))


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: dict[str, Any] | None = None
) -> str:
    return str(
        _in_pure(_setuptools.prepare_metadata_for_build_wheel, metadata_directory, config_settings)
    )


def get_requires_for_build_sdist(config_settings: dict[str, Any] | None = None) -> list[str]:
    return list(_in_pure(_setuptools.get_requires_for_build_sdist, config_settings))


def build_sdist(sdist_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    return str(_in_pure(_setuptools.build_sdist, sdist_directory, config_settings))


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    return list(_in_pure(_setuptools.get_requires_for_build_editable, config_settings))


def prepare_metadata_for_build_editable(
    metadata_directory: str, config_settings: dict[str, Any] | None = None
) -> str:
    return str(
        _in_pure(
            _setuptools.prepare_metadata_for_build_editable, metadata_directory, config_settings
        )
    )


def build_editable(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    if compiling():
        print(
            "sloserve: SLOSERVE_COMPILE=1 is ignored for an editable install (a compiled "
            "module would shadow the .py file you edit); install with `pip install .`",
            file=sys.stderr,
        )
    return str(
        _in_pure(_setuptools.build_editable, wheel_directory, config_settings, metadata_directory)
    )
