"""Finds and runs the code blocks of the documentation pages (used by ``test_docs.py``).

Which blocks run:

* ```` ```bash ```` blocks run as one bash script each (``set -euo pipefail``), so a block
  may hold several commands, line continuations and here-documents;
* ```` ```python ```` blocks of one page run in order in one interpreter, sharing their
  names (a later block may use what an earlier one defined);
* blocks with ``exec="on"`` are skipped here: markdown-exec runs them while the site builds
  (``mkdocs build --strict`` fails when one raises), and inserts their output in the page;
* a block titled with a file name (``title="my_policy.py"``) is also saved under that name
  in the current directory before it runs, so a later bash block can use the file (e.g.
  ``sloserve --plugin my_policy.py ...``);
* a ``--8<-- "path"`` line (pymdownx.snippets, path from the repository root) is replaced
  by that file's text, as the site build does;
* a block whose info string has ``title="Not run ...`` (the reason, shown to the reader) or
  the word ``notest`` is skipped: long-running servers and hour-long reproductions only.

Run as a script (``python docs_blocks.py PAGE.md``) it executes one page's blocks in the
current directory, in page order, and exits non-zero naming the first failing block.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

SNIPPET = re.compile(r'^\s*-{1,}8<-{1,}\s+"(?P<path>[^"]+)"\s*$')
TITLE_FILE = re.compile(r'title="(?P<name>[\w.-]+\.(?:py|ya?ml|csv|json))"')
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
BASH_TIMEOUT_S = 180


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    """1-based line of the block's first code line in the page."""
    lang: str
    info: str
    code: str

    @property
    def skipped(self) -> bool:
        info = self.info.lower()
        return (
            'exec="on"' in info
            or "exec=on" in info
            or re.search(r'title="not run', info) is not None
            or re.search(r"(^|\s)notest(\s|$)", info) is not None
        )

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def _root(page: Path) -> Path:
    """The repository root: the nearest folder above ``page`` holding ``mkdocs.yml``."""
    for parent in page.resolve().parents:
        if (parent / "mkdocs.yml").is_file():
            return parent
    raise FileNotFoundError(f"{page}: no mkdocs.yml above it")


def _expand(page: Path, code: list[str]) -> list[str]:
    out: list[str] = []
    for line in code:
        m = SNIPPET.match(line)
        if m:
            out.extend((_root(page) / m["path"]).read_text(encoding="utf-8").splitlines())
        else:
            out.append(line)
    return out


def blocks(page: Path) -> list[Block]:
    """Every fenced code block of ``page``, in order."""
    out: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent, info = m["fence"], m["indent"], m["info"].strip()
        j = i + 1
        while j < len(lines) and not re.match(
            rf"^{re.escape(indent)}{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j]
        ):
            j += 1
        code = textwrap.dedent("\n".join(_expand(page, lines[i + 1 : j])))
        lang = info.split()[0].lstrip(".{").lower() if info else ""
        out.append(Block(page, i + 2, lang, info, code + "\n"))
        i = j + 1
    return out


def runnable(page: Path) -> list[Block]:
    """The blocks of ``page`` that the docs test runs."""
    return [b for b in blocks(page) if b.lang in ("bash", "python") and not b.skipped]


def run_page(page: Path) -> None:
    """Run the runnable blocks of ``page`` in the current directory, in page order."""
    namespace: dict[str, object] = {"__name__": "__main__"}
    for b in runnable(page):
        print(f"--- {b.where} ({b.lang})", flush=True)
        saved = TITLE_FILE.search(b.info)
        if saved:
            Path(saved["name"]).write_text(b.code, encoding="utf-8")
        if b.lang == "python":
            # Pad with blank lines so that tracebacks give the page's own line numbers.
            source = "\n" * (b.line - 1) + b.code
            exec(compile(source, str(page), "exec"), namespace)
        else:
            try:
                done = subprocess.run(
                    ["bash", "-c", "set -euo pipefail\n" + b.code],
                    timeout=BASH_TIMEOUT_S,
                    capture_output=True,
                    text=True,
                )
            except subprocess.TimeoutExpired:
                sys.exit(f"{b.where}: bash block ran over {BASH_TIMEOUT_S} s")
            print(done.stdout[-3000:], flush=True)
            if done.returncode != 0:
                sys.exit(
                    f"{b.where}: bash block failed with status {done.returncode}\n"
                    f"{done.stderr[-3000:]}"
                )


if __name__ == "__main__":
    run_page(Path(sys.argv[1]))
