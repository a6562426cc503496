"""Helpers for tests of the command line: run it as a process or in process, and check the
one-line user-error contract (exit 2, one ``sloserve: error:`` line on stderr)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sloserve import cli


def cli_argv(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "sloserve.cli", *[str(a) for a in args]]


def run_many(argvs: dict[str, list[str]]) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run several command lines at once (each pays ~1 s of imports) and wait for all."""
    env = {**os.environ, "COLUMNS": "200"}
    procs = {
        k: subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for k, argv in argvs.items()
    }
    done = {}
    for k, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        done[k] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


def run_main(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> subprocess.CompletedProcess[str]:
    """``sloserve.cli.main()`` in process, as the console script calls it."""
    monkeypatch.setattr(sys, "argv", ["sloserve", *args])
    with pytest.raises(SystemExit) as ei:
        cli.main()
    out, err = capsys.readouterr()
    code = ei.value.code
    return subprocess.CompletedProcess(args, 0 if code is None else int(code), out, err)


def assert_user_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, exactly one line on stderr that starts 'sloserve: error:' and names the problem."""
    err = proc.stderr
    assert "Traceback" not in err, err
    assert proc.returncode == 2, (proc.returncode, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("sloserve: error: "), line
    for n in needles:
        assert n in line, (n, line)
    assert proc.stdout == "", proc.stdout
    return line


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
