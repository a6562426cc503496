"""QLM request groups (§4, Algorithm 1 of ``papers/qlm.txt``).

A request group is a FCFS list of similar requests: the same model, the same SLO class
(hence the same end-to-end deadline budget) and the same prompt-length bucket. Groups are
split so that none grows past ``group_size_factor × avg_batch_size`` requests: when the
open group of a key is full, a new one opens behind it (Algorithm 1's split step).

Choices where the paper is vague (parameters of :class:`GroupingConfig`):

- The length bucket is the prompt's power-of-two bucket (``floor(log2(prompt))``, at
  least ``min_bucket``). Output lengths are hidden (DESIGN.md), so they enter only through
  the group's fitted output distribution (``rct.py``), not through the key.
- A group's deadline is the earliest absolute deadline of its requests (arrival +
  ``slo.deadline_s``); a request without a deadline gets ``default_deadline_s``.
- A group keeps its identity until its last request leaves the global queue; a group
  whose requests have all been dispatched is dropped from the table (it no longer needs a
  place in a virtual queue: no migration once a group runs, §5 load balancing).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from sloserve.cluster.view import RouteRequest
from sloserve.core.errors import ConfigError


@dataclass(frozen=True)
class GroupingConfig:
    """How requests are grouped (Algorithm 1)."""

    group_size_factor: float = 4.0
    """Groups split at this multiple of the average batch size (§8.3 sweeps it)."""
    avg_batch_size: int = 16
    """The average running batch size of an instance (requests)."""
    min_bucket: int = 4
    """Prompts shorter than 2**min_bucket tokens share one bucket."""
    default_deadline_s: float = 3600.0
    """Deadline given to a request whose SLO names none."""

    def __post_init__(self) -> None:
        if not (self.group_size_factor > 0 and math.isfinite(self.group_size_factor)):
            raise ConfigError(f"group_size_factor: must be > 0, got {self.group_size_factor}")
        if self.avg_batch_size < 1:
            raise ConfigError(f"avg_batch_size: must be >= 1, got {self.avg_batch_size}")
        if not 0 < self.default_deadline_s < math.inf:
            raise ConfigError(f"default_deadline_s: must be > 0, got {self.default_deadline_s}")

    @property
    def max_group_size(self) -> int:
        return max(1, int(self.group_size_factor * self.avg_batch_size))


@dataclass(frozen=True, slots=True)
class GroupKey:
    """What makes requests similar: model, SLO class (its deadline budget), prompt bucket."""

    model: str
    deadline_s: float
    bucket: int


@dataclass(slots=True)
class RequestGroup:
    """A FCFS list of similar queued requests (references; requests live in the global
    queue)."""

    group_id: int
    key: GroupKey
    requests: list[RouteRequest] = field(default_factory=list)
    deadline: float = math.inf
    """Earliest absolute deadline among its requests."""
    closed: bool = False
    """Full: new requests of its key open a new group."""

    @property
    def model(self) -> str:
        return self.key.model

    @property
    def size(self) -> int:
        return len(self.requests)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.requests)


def bucket_of(prompt_tokens: int, min_bucket: int) -> int:
    """The power-of-two bucket of a prompt length."""
    return max(min_bucket, max(prompt_tokens, 1).bit_length() - 1)


class GroupTable:
    """The live request groups, by id, and the group of each queued request."""

    def __init__(self, cfg: GroupingConfig) -> None:
        self.cfg = cfg
        self.groups: dict[int, RequestGroup] = {}
        self._open: dict[GroupKey, RequestGroup] = {}
        self._of: dict[int | str, RequestGroup] = {}
        self._next = 0

    def key_of(self, req: RouteRequest) -> GroupKey:
        d = req.slo.deadline_s if req.slo.deadline_s is not None else self.cfg.default_deadline_s
        return GroupKey(req.model, d, bucket_of(req.prompt_tokens, self.cfg.min_bucket))

    def add(self, req: RouteRequest) -> RequestGroup:
        """Put ``req`` in the open group of its key (a new one when full); idempotent."""
        g = self._of.get(req.req_id)
        if g is not None:
            return g
        key = self.key_of(req)
        g = self._open.get(key)
        if g is None or g.closed:
            g = RequestGroup(self._next, key)
            self._next += 1
            self.groups[g.group_id] = g
            self._open[key] = g
        g.requests.append(req)
        g.deadline = min(g.deadline, req.arrival + key.deadline_s)
        if g.size >= self.cfg.max_group_size:
            g.closed = True
        self._of[req.req_id] = g
        return g

    def group_of(self, req_id: int | str) -> RequestGroup | None:
        return self._of.get(req_id)

    def remove(self, req_id: int | str) -> RequestGroup | None:
        """``req_id`` left the global queue (dispatched, or ended): forget it; its group is
        dropped once empty. Returns the group it was in."""
        g = self._of.pop(req_id, None)
        if g is None:
            return None
        g.requests = [r for r in g.requests if r.req_id != req_id]
        if not g.requests:
            del self.groups[g.group_id]
            if self._open.get(g.key) is g:
                del self._open[g.key]
        return g

    def __iter__(self) -> Iterator[RequestGroup]:
        return iter(self.groups.values())

    def __len__(self) -> int:
        return len(self.groups)
