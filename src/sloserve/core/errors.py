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


def _n(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


# pydantic error types → plain words (its own "Input should be …" wording is an internal).
_PLAIN: dict[str, str] = {
    "greater_than_equal": "must be ≥ {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be ≤ {le}",
    "less_than": "must be < {lt}",
    "multiple_of": "must be a multiple of {multiple_of}",
    "int_parsing": "must be a whole number",
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": "must be text",
    "missing": "is required",
    "literal_error": "must be one of {expected}",
    "enum": "must be one of {expected}",
    "dict_type": "must be a mapping of keys",
    "model_type": "must be a mapping of keys",
    "model_attributes_type": "must be a mapping of keys",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
    "too_short": "must have at least {min_length} item(s)",
    "too_long": "must have at most {max_length} item(s)",
    "string_too_short": "must have at least {min_length} character(s)",
    "string_too_long": "must have at most {max_length} character(s)",
    "union_tag_invalid": "unknown {discriminator} {tag!r}; valid: {expected_tags}",
    "union_tag_not_found": "needs a {discriminator} key",
    "frozen_instance": "cannot be changed",
    "extra_forbidden": "is not a known key",
}


def plain_message(err: Any) -> str:
    """One pydantic error (an item of ``ValidationError.errors()``) in plain words, without
    the value: ``"must be ≥ 1"``, ``"must be a whole number"``. A validator's own message is
    kept as it is."""
    ctx = dict(err.get("ctx") or {})
    kind = str(err.get("type", ""))
    if kind in ("value_error", "assertion_error") and "error" in ctx:
        return str(ctx["error"])
    template = _PLAIN.get(kind)
    if kind in ("literal_error", "enum") and isinstance(err.get("input"), str):
        import re

        valid = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        template = f"must be one of {{expected}}{did_you_mean(err['input'], valid)}"
    if kind == "union_tag_invalid":
        import re

        valid = re.findall(r"'([^']*)'", str(ctx.get("expected_tags", "")))
        what = str(ctx.get("discriminator", "kind")).strip("'")
        tag = str(ctx.get("tag"))
        return f"unknown {what} {tag!r}{did_you_mean(tag, valid)}; valid: {', '.join(valid)}"
    if template is not None:
        try:
            return template.format(**{k: _n(v) if k != "tag" else v for k, v in ctx.items()})
        except (KeyError, IndexError, ValueError):
            pass
    msg = str(err.get("msg", "invalid value"))
    for old, new in (("Value error, ", ""), ("Input should be", "must be"), ("Input", "value")):
        msg = msg.replace(old, new)
    return msg
