"""Load YAML data files with libyaml's C parser when it is installed.

``yaml.safe_load`` uses the pure-Python parser (≈ 6.7 ms for a profile file);
``yaml.CSafeLoader`` parses the same text with libyaml (≈ 0.8 ms) and builds the
result with the very same ``SafeConstructor`` and resolver, so the dicts are equal
(tests/test_yamlload.py checks every built-in profile and catalog file). Error text
differs between the two parsers, so on a parse error we parse again with the pure
loader and raise *its* error: what a user sees for bad YAML does not change.

The two parsers disagree on two things, so text containing either goes to the pure
parser: libyaml accepts a tab as a separator where the pure parser rejects it
(``a:\\t1``), and reads a byte-order mark inside the text differently. Whether a file
loads must not depend on how PyYAML was built.

A scalar YAML parses but Python cannot build (the date ``2024-13-45``) or nesting too
deep for the constructor raise :class:`YAMLValueError`, a ``yaml.YAMLError``, so every
caller's "not valid YAML" error covers them instead of a traceback.
"""

from __future__ import annotations

from typing import Any

import yaml

# Absent when PyYAML was built without libyaml: then the pure loader is used.
_FAST_LOADER: Any = getattr(yaml, "CSafeLoader", None)


class YAMLValueError(yaml.YAMLError):
    """Well-formed YAML whose value Python cannot build (an impossible date, nesting too
    deep): the problem in one line."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def _pure(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise YAMLValueError("nested too deeply") from None
    except (ValueError, OverflowError) as e:  # (a YAMLError is not a ValueError)
        raise YAMLValueError(f"bad value: {e}") from None


def safe_load(text: str) -> Any:
    """``yaml.safe_load(text)``, parsed by libyaml when available.

    Raises the pure loader's ``yaml.YAMLError`` on bad input, message unchanged, and
    :class:`YAMLValueError` on a value Python cannot build.
    """
    if _FAST_LOADER is None or "\t" in text or "\ufeff" in text:
        return _pure(text)
    try:
        return yaml.load(text, Loader=_FAST_LOADER)
    except (yaml.YAMLError, ValueError, OverflowError, RecursionError):
        # Re-parse for the pure parser's exact error (marks and wording).
        return _pure(text)
