"""Typed exceptions. The CLI turns every :class:`SloserveError` into one line and exit 2."""

from __future__ import annotations

from typing import Any


class SloserveError(Exception):
    """Base class of every error sloserve raises on purpose (bad input, bad policy output)."""


class ConfigError(SloserveError, ValueError):
    """A configuration value (flag, YAML key, profile field) is invalid."""


class WorkloadError(SloserveError, ValueError):
    """A workload spec or trace file is invalid; the message names file, row and column."""


class UnknownNameError(ConfigError, KeyError):
    """A registry lookup failed; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it verbatim
        return str(self.args[0]) if self.args else ""


class InvalidTransition(SloserveError, RuntimeError):
    """A request was moved between states in an order the state machine forbids."""


class SchedulerViolation(SloserveError, RuntimeError):
    """A policy returned a SchedulerOutput that breaks a limit or the KV cache's state.

    The message names the policy, the violated limit and the offending values, so a policy
    author can fix the bug instead of debugging a corrupted engine.
    """

    def __init__(self, policy: str, limit: str, detail: str) -> None:
        self.policy = policy
        self.limit = limit
        self.detail = detail
        super().__init__(f"policy {policy!r} violated {limit}: {detail}")

    def __reduce__(self) -> tuple[type[SchedulerViolation], tuple[str, str, str]]:
        # Pickled across worker processes (parallel reproductions): rebuild from the fields,
        # not from the formatted message that BaseException would pass back.
        return (type(self), (self.policy, self.limit, self.detail))


class StallError(SloserveError, RuntimeError):
    """The simulation cannot make progress (a policy schedules nothing while work remains)."""


def yaml_problem(e: Any) -> str:
    """A PyYAML error as one line: the problem and the line it is on."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"{problem} at line {mark.line + 1}" if mark is not None else str(problem)


def did_you_mean(name: str, valid: list[str] | tuple[str, ...]) -> str:
    """``" (did you mean 'sarathi'?)"`` for the valid name closest to ``name`` (difflib),
    or ``""`` when none is close: appended to every unknown-name message."""
    import difflib

    close = difflib.get_close_matches(str(name), [str(v) for v in valid], n=1, cutoff=0.6)
    if not close:
        lower = {str(v).lower(): str(v) for v in valid}
        close = [lower[str(name).lower()]] if str(name).lower() in lower else []
    return f" (did you mean {close[0]!r}?)" if close else ""
