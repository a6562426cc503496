"""Load YAML data files with libyaml's C parser when it is installed.

``yaml.safe_load`` uses the pure-Python parser (≈ 6.7 ms for a profile file);
``yaml.CSafeLoader`` parses the same text with libyaml (≈ 0.8 ms) and builds the
result with the very same ``SafeConstructor`` and resolver, so the dicts are equal
(tests/test_yamlload.py checks every built-in profile and catalog file). Error text
differs between the two parsers, so on a parse error we parse again with the pure
loader and raise *its* error: what a user sees for bad YAML does not change.
"""

from __future__ import annotations

from typing import Any

import yaml

# Absent when PyYAML was built without libyaml: then the pure loader is used.
_FAST_LOADER: Any = getattr(yaml, "CSafeLoader", None)


def safe_load(text: str) -> Any:
    """``yaml.safe_load(text)``, parsed by libyaml when available.

    Raises the pure loader's ``yaml.YAMLError`` on bad input, message unchanged.
    """
    if _FAST_LOADER is None:
        return yaml.safe_load(text)
    try:
        return yaml.load(text, Loader=_FAST_LOADER)
    except yaml.YAMLError:
        # Re-parse for the pure parser's exact error (marks and wording).
        return yaml.safe_load(text)
