"""Help and error wording (issue 20, item 13): real metavars and defaults in --help, every
workload mix listed from the registry, did-you-mean on unknown names, plain words instead of
pydantic's in every error."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field, ValidationError

from cli_helpers import assert_user_error, run_main, write
from sloserve.config import error_text, validation_message
from sloserve.core.errors import did_you_mean, plain_message


def _commands() -> list[list[str]]:
    import typer

    from sloserve.cli import app

    out: list[list[str]] = []

    def walk(c: Any, path: list[str]) -> None:
        subs = getattr(c, "commands", {})
        for name, sub in subs.items():
            walk(sub, [*path, name])
        if not subs:
            out.append(path)

    walk(typer.main.get_command(app), [])
    return out


def test_no_type_name_metavars_in_any_help(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    commands = _commands()
    assert len(commands) > 10
    for path in commands:
        out = run_main(monkeypatch, capsys, *path, "--help").stdout
        bad = re.findall(r"<(?:int|float|bool|str|path|text)[^>]*>", out)
        assert not bad, (path, bad)


def test_simulate_help_shows_defaults_metavars_and_every_mix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sloserve.workloads.mixes import mix_names

    monkeypatch.setenv("COLUMNS", "250")
    out = " ".join(run_main(monkeypatch, capsys, "simulate", "--help").stdout.split())
    for mix in mix_names():
        assert mix in out, mix
    for text in (
        "[default: 256]",  # --max-running, from InstanceConfig
        "[default: 4096]",  # --max-batch-tokens
        "[default: 0.9]",  # --kv-utilization
        "[default: 4.0]",  # --rate
        "[default: poisson]",  # --arrival
        "[default: llama-2-7b-a100]",  # --profile
    ):
        assert text in out, text
    for flag, metavar in (("--rate", "RATE"), ("--duration", "SECONDS"), ("--profile", "NAME")):
        assert re.search(rf"{flag} .*?{metavar}", out), flag
    # on/off flags take no value, so show none
    assert re.search(r"--strict --no-strict Unsorted", out)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["simulate", "--policy", "sarati"], "did you mean 'sarathi'?"),
        (["simulate", "--router", "round-robn", "--replicas", "2"], "did you mean 'round-robin'?"),
        (["simulate", "--profile", "llama-2-7b-a10"], "did you mean 'llama-2-7b-a100'?"),
        (["simulate", "--workload", "sharegtp"], "did you mean 'sharegpt'?"),
        (["simulate", "--result-format", "vlm", "--json"], "did you mean 'vllm'?"),
    ],
)
def test_unknown_names_suggest_the_closest(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    needle: str,
) -> None:
    proc = run_main(monkeypatch, capsys, *args, "--num-requests", "3")
    assert_user_error(proc, needle)


def test_unknown_trace_format_suggests(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = write(tmp_path / "t.csv", "arrival_s,prompt_tokens,output_tokens\n0,10,10\n")
    proc = run_main(
        monkeypatch, capsys, "simulate", "--trace", str(trace), "--trace-format", "mooncak"
    )
    assert_user_error(proc, "did you mean 'mooncake'?")


def test_did_you_mean_is_silent_when_nothing_is_close() -> None:
    assert did_you_mean("zzzzzz", ["sarathi", "vllm"]) == ""
    assert did_you_mean("VLLM", ["sarathi", "vllm"]) == " (did you mean 'vllm'?)"


class _M(BaseModel):
    n: int = Field(ge=1)
    x: float = Field(gt=0, le=1)
    kind: str = "a"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"n": 0, "x": 0.5}, "n: must be ≥ 1 (got 0)"),
        ({"n": 1, "x": 2.0}, "x: must be ≤ 1 (got 2.0)"),
        ({"n": 1, "x": 0}, "x: must be > 0 (got 0)"),
        ({"n": "abc", "x": 0.5}, "n: must be a whole number (got 'abc')"),
        ({"n": 1.5, "x": 0.5}, "n: must be a whole number (got 1.5)"),
        ({"n": 1, "x": "big"}, "x: must be a number (got 'big')"),
        ({"x": 0.5}, "n: is required"),
        ({"n": 1, "x": 0.5, "kind": 3}, "kind: must be text (got 3)"),
    ],
)
def test_validation_messages_are_plain_words(data: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValidationError) as ei:
        _M.model_validate(data)
    msg = validation_message(ei.value, "f.yaml")
    assert msg == f"f.yaml: {expected}"
    assert "Input should" not in msg and "input_value" not in msg
    assert error_text(ei.value.errors()[0]) == expected.split(": ", 1)[1]


def test_plain_message_falls_back_without_pydantic_wording() -> None:
    err = {"type": "some_new_type", "msg": "Input should be a valid widget", "ctx": {}}
    assert plain_message(err) == "must be a valid widget"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-running", "0"], "--max-running (instance.max_running): must be ≥ 1 (got 0)"),
        (["--max-num-seqs", "0"], "--max-num-seqs': must be ≥ 1 (got 0)"),
        (["--kv-utilization", "1.5"], "must be ≤ 1 (got 1.5)"),
    ],
)
def test_cli_errors_have_no_pydantic_wording(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    needle: str,
) -> None:
    proc = run_main(monkeypatch, capsys, "simulate", *args, "--num-requests", "3")
    line = assert_user_error(proc, needle)
    assert "Input should" not in line


def test_yaml_errors_have_no_pydantic_wording(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cfg = write(tmp_path / "c.yaml", "instance: {max_running: many}\n")
    proc = run_main(monkeypatch, capsys, "simulate", "--config", str(cfg))
    line = assert_user_error(proc, "c.yaml", "instance.max_running", "must be a whole number")
    assert "Input should" not in line


def test_unknown_arrival_kind_suggests(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = run_main(monkeypatch, capsys, "simulate", "--arrival", "gama")
    assert_user_error(proc, "unknown kind 'gama' (did you mean 'gamma'?); valid: poisson")


# Checked with typer 0.29.2 (click 8.5.1): _narrowed copies the app (copy.copy) and keeps
# one of its ``registered_commands`` (and no ``registered_groups``), typer internals.
@pytest.mark.parametrize(
    "args",
    [["simulate", "--help"], ["compare", "--help"], ["simulate", "--rate", "x", "--help"]],
)
def test_narrowed_app_help_is_the_whole_apps(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    """A run builds only the command it names (``_narrowed``, typer internals): its help
    must be the whole app's, to the character; this fails loudly if typer changes them."""
    from sloserve.cli import _app

    n = len(_app.app.registered_commands)
    only = _app._narrowed(args)
    assert only is not _app.app and len(only.registered_commands) == 1
    assert only.registered_groups == [] and len(_app.app.registered_commands) == n
    narrowed = run_main(monkeypatch, capsys, *args)
    monkeypatch.setattr(_app, "_narrowed", lambda a: _app.app)
    whole = run_main(monkeypatch, capsys, *args)
    assert narrowed.returncode == whole.returncode == 0
    assert narrowed.stdout == whole.stdout and "--trace" in whole.stdout
