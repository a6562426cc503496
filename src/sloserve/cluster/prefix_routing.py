"""Cache-aware routing: prefix affinity, prefix + load, and session affinity.

Three routers on the shared Filter → Scorer → Picker contract (``cluster/routing.py``),
registered under their names when the cluster package loads:

- ``prefix-affinity`` (llm-d's prefix-cache scorer): the cost of a replica is the fraction
  of the request's prompt it does **not** hold in its prefix cache; requests held
  (outstanding) break ties with weight ``load_weight`` (0.1), so with no hit anywhere the
  least loaded replica wins.
- ``prefix-load`` (Dynamo's KV router trades overlap against load): the same prefix cost
  with weight ``prefix_weight`` (1.0), plus outstanding requests (``load_weight``, 1.0) and
  KV usage (``kv_weight``, 0), each min-max normalised over the candidates.

The prefix index and request counts are all these routers read: they let replicas
fast-forward past other replicas' events (``Router.reads_progress`` False; a ``kv_weight``
above 0 reads KV usage and turns it on). A replica in a fast-forwarded prefill run
registers the units of the run's chunks when the run ends (as a single step registers its
chunk's when it ends, ``engine/prefix_cache.py``): mid-run the exact scorer sees the
units registered before the run, a few iterations late (a chunk run,
``engine/chunk_run.py``, registers at each of its phases' ends, as the steps it replaces).
- ``session-affinity``: sticky by session: a request goes where its session's previous
  request went while that replica accepts requests, else (and for a session's first
  request) to the replica holding the fewest requests. A request's session is its
  ``session_id`` when it has one (generated sessions, ``workloads/sessions.py``), else its
  prompt's first ``session_blocks`` (2) identity blocks (Mooncake's traces carry no session
  id; a conversation's turns share their first blocks, the first one alone is a system
  prompt shared by everyone); a prompt with fewer blocks has no session and goes by load.

Where the prefix comes from (``mode``):

- ``exact`` (the default; simulation): the replica's own prefix index, read through
  :meth:`ReplicaView.cached_prefix_tokens` (what llm-d's precise scorer rebuilds from the
  engines' KV-cache events): the tokens of the prompt's longest cached prefix there. A
  prefix whose request is still queued there is not cached yet: the scorer does not see
  it (adding the router's own index of what it sent, below, herds every request onto
  the first replica that got the system prompt everyone shares; measured in the docs).
- ``approximate`` (the live gateway, where an engine's cache is invisible; also when a
  view answers None): an index the router keeps of where it sent each prefix — per
  replica an LRU of chained chunk hashes, ``index_blocks`` (50,000) entries — as llm-d's
  approximate scorer does. It is updated at each decision that picks a replica it is
  read for (in exact mode: one whose view answered None in that decision — a view's
  answer is None always or never: the gateway's upstreams, the simulated replicas); it
  does not see evictions.
  In simulation the chunks are the request's identity blocks (``hash_ids``); in the
  gateway the prompt text hashed in fixed chunks of :data:`TEXT_CHUNK_CHARS` characters
  (:func:`text_block_ids`).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from sloserve.cluster.routing import (
    Decision,
    Hold,
    PipelineRouter,
    Router,
    Scorer,
    kv_score,
    lowest_pick,
    outstanding_score,
    register_router,
)
from sloserve.cluster.view import (
    ClusterView,
    ReplicaStatus,
    ReplicaView,
    RouteRequest,
    cached_prefix_tokens_all,
)
from sloserve.core.errors import ConfigError

TEXT_CHUNK_CHARS = 256
"""Characters per hashed chunk of a prompt's text in the gateway (about 64 tokens)."""


def text_block_ids(text: str, chunk_chars: int = TEXT_CHUNK_CHARS) -> tuple[int, ...]:
    """Identity blocks of a prompt's text: one stable 63-bit hash per full chunk of
    ``chunk_chars`` characters (a partial last chunk has none: it cannot be a shared
    prefix block). Stable across processes (blake2b, not Python's salted ``hash``)."""
    out = []
    for i in range(0, len(text) - chunk_chars + 1, chunk_chars):
        digest = hashlib.blake2b(text[i : i + chunk_chars].encode(), digest_size=8).digest()
        out.append(int.from_bytes(digest, "big") >> 1)
    return tuple(out)


def _chain(ids: Sequence[int]) -> list[int]:
    keys, h = [], 0
    for b in ids:
        h = hash((h, b))
        keys.append(h)
    return keys


class ApproxPrefixIndex:
    """Per replica, an LRU of the chained prefix keys the router sent there."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ConfigError(f"router_params.index_blocks must be >= 1, got {capacity}")
        self.capacity = capacity
        self._by_replica: dict[int, OrderedDict[int, None]] = {}

    def matched(self, replica_id: int, keys: Sequence[int]) -> int:
        """Leading keys of ``keys`` recorded for ``replica_id``."""
        lru = self._by_replica.get(replica_id)
        if not lru:
            return 0
        n = 0
        for k in keys:
            if k not in lru:
                break
            n += 1
        return n

    def record(self, replica_id: int, keys: Sequence[int]) -> None:
        lru = self._by_replica.setdefault(replica_id, OrderedDict())
        for k in keys:
            lru[k] = None
            lru.move_to_end(k)
        while len(lru) > self.capacity:
            lru.popitem(last=False)


class PrefixRouter(PipelineRouter):
    """A pipeline router with a prefix scorer (module docstring)."""

    def __init__(
        self,
        name: str,
        scorers: Sequence[Scorer],
        *,
        mode: str,
        prefix_weight: float,
        index_blocks: int,
        reads_progress: bool,
    ) -> None:
        if mode not in ("exact", "approximate"):
            raise ConfigError(f"router_params.mode must be exact or approximate, got {mode!r}")
        self.mode = mode
        self._exact = mode == "exact"
        self.index = ApproxPrefixIndex(index_blocks)
        self._keys: tuple[Any, list[int]] = (None, [])
        # Exact mode: the replicas whose view answered None in this decision. The index is
        # read only for those, so only a decision for one of them records there (every
        # decision did: ~0.07 s a run on 16 replicas of the Mooncake trace, for entries
        # never read when every view answers).
        self._blind: set[int] = set()
        prefix = Scorer("prefix", self._miss_fraction, prefix_weight, self._miss_fractions)
        super().__init__(name, [], [prefix, *scorers], lowest_pick(), reads_progress=reads_progress)

    def _chain_of(self, req: RouteRequest) -> list[int]:
        ids = req.hash_ids or ()
        if self._keys[0] is not ids:  # one chain per decision, not per candidate
            self._keys = (ids, _chain(ids))
        return self._keys[1]

    def _miss_fraction(self, req: RouteRequest, r: ReplicaView) -> float:
        """1 - the fraction of the prompt cached on ``r`` (lower is better)."""
        if not req.hash_ids:
            return 1.0
        cached = r.cached_prefix_tokens(req) if self._exact else None
        if cached is not None:  # (min inlined: the scorer runs for every replica)
            prompt = req.prompt_tokens
            return 1.0 - (cached if cached < prompt else prompt) / prompt
        return self._indexed_miss(req, r)

    def _indexed_miss(self, req: RouteRequest, r: ReplicaView) -> float:
        """The miss fraction by the router's own index, for a view that cannot answer."""
        self._blind.add(r.replica_id)
        keys = self._chain_of(req)
        return 1.0 - self.index.matched(r.replica_id, keys) / len(keys)

    def _miss_fractions(self, req: RouteRequest, cand: Sequence[ReplicaView]) -> list[float]:
        """:meth:`_miss_fraction` of every candidate, the replicas asked at once
        (:func:`~sloserve.cluster.view.cached_prefix_tokens_all`: one pass over the
        simulated replicas' caches instead of a call per replica)."""
        if not req.hash_ids:
            return [1.0] * len(cand)
        if not self._exact:
            return [self._miss_fraction(req, r) for r in cand]
        prompt = req.prompt_tokens
        out = []
        for r, cached in zip(cand, cached_prefix_tokens_all(req, cand), strict=True):
            if cached is None:  # as _miss_fraction does for a view that answers None
                out.append(self._indexed_miss(req, r))
            else:
                out.append(1.0 - (cached if cached < prompt else prompt) / prompt)
        return out

    def route(
        self, req: RouteRequest, view: ClusterView, explain: dict[str, Any] | None = None
    ) -> Decision:
        blind = self._blind
        blind.clear()
        d = super().route(req, view, explain)
        if not isinstance(d, Hold) and req.hash_ids and d in blind:
            self.index.record(d, self._chain_of(req))
        return d


def _prefix_affinity(
    seed: int, load_weight: float = 0.1, mode: str = "exact", index_blocks: int = 50_000
) -> Router:
    return PrefixRouter(
        "prefix-affinity",
        [Scorer("outstanding", outstanding_score, load_weight)],
        mode=mode,
        prefix_weight=1.0,
        index_blocks=index_blocks,
        reads_progress=False,
    )


def _prefix_load(
    seed: int,
    prefix_weight: float = 1.0,
    load_weight: float = 1.0,
    kv_weight: float = 0.0,
    mode: str = "exact",
    index_blocks: int = 50_000,
) -> Router:
    return PrefixRouter(
        "prefix-load",
        [Scorer("outstanding", outstanding_score, load_weight), Scorer("kv", kv_score, kv_weight)],
        mode=mode,
        prefix_weight=prefix_weight,
        index_blocks=index_blocks,
        reads_progress=kv_weight > 0,
    )


class SessionAffinityRouter(Router):
    """Sticky by session, least outstanding otherwise (module docstring)."""

    name = "session-affinity"
    reads_progress = False  # request counts, model and status only

    def __init__(self, session_blocks: int = 2) -> None:
        if session_blocks < 1:
            raise ConfigError(f"router_params.session_blocks must be >= 1, got {session_blocks}")
        self.session_blocks = session_blocks
        self._home: dict[object, int] = {}
        self._least = PipelineRouter(
            "session-affinity",
            [],
            [Scorer("outstanding", outstanding_score)],
            lowest_pick(),
            reads_progress=False,
        )

    def route(self, req: RouteRequest, view: ClusterView) -> Decision:
        ids = req.hash_ids or ()
        session: object = None
        if req.session_id is not None:
            session = ("id", req.session_id)
        elif len(ids) >= self.session_blocks:
            session = tuple(ids[: self.session_blocks])
        if session is not None:
            home = self._home.get(session)
            if home is not None:
                for r in view.serving(req.model):
                    if r.replica_id == home and r.status is ReplicaStatus.UP:
                        return home
        d = self._least.route(req, view)
        if session is not None and not isinstance(d, Hold):
            self._home[session] = d
        return d


def _session_affinity(seed: int, session_blocks: int = 2) -> Router:
    return SessionAffinityRouter(session_blocks)


register_router(
    "prefix-affinity",
    _prefix_affinity,
    "most of the prompt's prefix cached there (llm-d's prefix-cache scorer); load breaks ties",
)
register_router(
    "prefix-load",
    _prefix_load,
    "cached prefix traded against load by weights (Dynamo's KV router style)",
)
register_router(
    "session-affinity",
    _session_affinity,
    "sticky by session id (else the prompt's first blocks), least outstanding otherwise",
)
