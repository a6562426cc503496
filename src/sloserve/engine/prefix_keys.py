"""Prompt identity -> cache unit keys (the block-size mapping of
:mod:`~sloserve.engine.prefix_cache`'s docstring).

A prompt's identity is Mooncake's ``hash_ids``: one id per ``source_tokens`` (512) tokens,
equal ids meaning an identical block. A cache unit ``i`` (``unit_tokens`` tokens) is keyed
by the chained hash of every trace block up to the one holding its last token, with the
unit's end; when a unit is exactly one trace block, by the chained hash alone (the chain's
length is the end). Equal keys mean an identical prefix; a key names its whole prefix, so
two prompts' keys agree up to a point and never again. When the unit's end is inside a
trace block (``unit_tokens`` not a multiple of 512) the key includes that whole block:
stricter than needed, some hits are missed, never a false one. Keys are Python's
integer/tuple hashes (deterministic: no hash randomisation for ints), 64 bits wide.
"""

from __future__ import annotations

from collections import OrderedDict

_RECENT = 256
"""Prompts whose keys :func:`unit_keys` remembers (the most recent)."""

_recent: OrderedDict[int, tuple[tuple[int, ...], int, int, int, tuple[int, ...]]] = OrderedDict()
"""The recent prompts' keys a router asked for, by the identity of their ``hash_ids``: a
router asks every replica of one decision, and the chosen replica looks up at its next
decision, often after other requests were routed (on 16 replicas of the Mooncake trace
half the lookups came after another decision and hashed the chain again: 24,059 chains
for 12,031 requests). An identity test instead of hashing the ids again; an entry keeps
its ``hash_ids`` alive, so that no other object takes its id meanwhile. Oldest first."""


def unit_keys(
    hash_ids: tuple[int, ...], prompt_tokens: int, unit_tokens: int, source_tokens: int
) -> tuple[int, ...]:
    """Keys of the full cache units of a prompt (module docstring), remembered among the
    recent prompts' (a router's peeks). Only units inside the prompt and covered by
    ``hash_ids`` have a key."""
    m = _recent.get(id(hash_ids))
    if m is not None and m[1] == prompt_tokens and m[2] == unit_tokens and m[3] == source_tokens:
        return m[4]  # (m[0] is hash_ids: the entry keeps it alive, no other object has its id)
    keys = _unit_keys(hash_ids, prompt_tokens, unit_tokens, source_tokens)
    if m is None and len(_recent) >= _RECENT:
        _recent.popitem(last=False)
    _recent[id(hash_ids)] = (hash_ids, prompt_tokens, unit_tokens, source_tokens, keys)
    return keys


def prompt_keys(
    hash_ids: tuple[int, ...], prompt_tokens: int, unit_tokens: int, source_tokens: int
) -> tuple[int, ...]:
    """:func:`unit_keys` for a lookup, which keeps its request's keys itself: those a router
    computed for it, else computed here (not remembered: most lookups follow no peek)."""
    m = _recent.get(id(hash_ids))
    if m is not None and m[1] == prompt_tokens and m[2] == unit_tokens and m[3] == source_tokens:
        return m[4]
    return _unit_keys(hash_ids, prompt_tokens, unit_tokens, source_tokens)


def _unit_keys(
    hash_ids: tuple[int, ...], prompt_tokens: int, unit_tokens: int, source_tokens: int
) -> tuple[int, ...]:
    covered = min(prompt_tokens, len(hash_ids) * source_tokens)
    n = covered // unit_tokens
    if n == 0:
        return ()
    prefix: list[int] = []  # the chained hash of each trace block
    append = prefix.append
    h = 0
    for block in hash_ids[: ((n * unit_tokens) - 1) // source_tokens + 1]:
        h = hash((h, block))
        append(h)
    if unit_tokens == source_tokens:  # unit i is trace block i: its chain ends there
        return tuple(prefix)
    ends = range(unit_tokens, n * unit_tokens + 1, unit_tokens)
    return tuple(hash((prefix[(end - 1) // source_tokens], end)) for end in ends)
