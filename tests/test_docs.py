"""The documentation site: it builds with ``--strict`` and every example on it runs.

``mkdocs build --strict`` fails on a broken link, a missing page or an example marked
``exec="on"`` that raises (markdown-exec runs those while building). Each page's other
```` ```bash ```` and ```` ```python ```` blocks run in a fresh temporary directory, in page
order, in a subprocess (see ``docs_blocks.py`` for what runs and how a block opts out).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from docs_blocks import runnable

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(p.relative_to(DOCS) for p in DOCS.rglob("*.md"))
# The README is the front door: its examples run too (as "../README.md" from docs/).


def _env() -> dict[str, str]:
    """The venv's console scripts (``sloserve``, ``mkdocs``) on PATH, this checkout's code
    first on the import path."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    env["NO_MKDOCS_2_WARNING"] = "1"
    env.setdefault("MPLBACKEND", "Agg")
    return env


def test_site_builds_strict(tmp_path: Path) -> None:
    import markdown_exec  # noqa: F401
    import mkdocs  # noqa: F401  (a dev dependency: a missing one must fail, not skip)
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    problems = [ln for ln in done.stderr.splitlines() if "WARNING" in ln or "ERROR" in ln]
    assert done.returncode == 0, "\n".join(problems) or done.stderr[-4000:]


# Only pages with something to run: a page of prose has no example that could fail.
@pytest.mark.parametrize(
    "page", [str(p) for p in [*PAGES, Path("../README.md")] if runnable(DOCS / p)]
)
def test_page_examples_run(page: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("docs_blocks.py")), str(DOCS / page)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-4000:]}"
