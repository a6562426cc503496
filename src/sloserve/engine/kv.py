"""KV-cache block managers and the CPU swap tier.

Extension point: :class:`KVCacheManager` is the interface the instance and policies use;
BROS's bidirectional blocks implement the same interface. Every method is O(blocks touched):
the free list is a stack, so allocating or freeing a block is O(1).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence

import numpy as np

from sloserve.core.errors import SloserveError
from sloserve.core.request import Request, RequestClass
from sloserve.engine import kv_kernels


class KVInvariantError(SloserveError, AssertionError):
    """The KV manager's bookkeeping is inconsistent (a bug, never a user error)."""


class CPUSwapTier:
    """Host memory for swapped-out KV blocks: a capacity in blocks; transfer time comes
    from the cost model's ``swap_time``."""

    __slots__ = ("capacity_blocks", "used_blocks")

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise ValueError("CPU swap capacity must be >= 0 blocks")
        self.capacity_blocks = capacity_blocks
        self.used_blocks = 0

    @property
    def free_blocks(self) -> int:
        return self.capacity_blocks - self.used_blocks


KVOp = tuple[str, int, int]
"""One KV operation of an iteration, in the order the instance applies them:
``("free", req_id, 0)``, ``("swap_out", req_id, 0)``, ``("swap_in", req_id, 0)`` or
``("grow", req_id, n_tokens)``."""


class KVCacheManager(ABC):
    """Tracks which request holds which KV blocks on the GPU, and what is on the CPU."""

    block_size: int
    num_blocks: int

    exact_fit: bool = False
    """True when whether a batch fits depends on the order of its operations (BROS's
    shared blocks): the instance then validates with :meth:`dry_run` instead of adding up
    :meth:`blocks_needed`."""

    def dry_run(self, ops: Sequence[KVOp]) -> str | None:
        """Whether ``ops`` would all succeed, in order, leaving this manager unchanged:
        None, or what fails. Required when :attr:`exact_fit` is True."""
        raise NotImplementedError(f"{type(self).__name__} has no dry run")

    can_shrink: bool = False
    """True when :meth:`shrink` is supported (the engine can then cut a fast-forwarded
    run short when a request reaches the instance mid-run)."""

    def shrink(self, req_id: int, n_tokens: int) -> None:
        """Give back the last ``n_tokens`` a request grew by (and the blocks they alone
        used). Required when :attr:`can_shrink` is True."""
        raise NotImplementedError(f"{type(self).__name__} cannot shrink")

    def shrink_many(self, req_ids: Sequence[int], n_tokens: int) -> None:
        """:meth:`shrink` each request by ``n_tokens``, in order (a cut run of decodes)."""
        for r in req_ids:
            self.shrink(r, n_tokens)

    def note_class(self, req_id: int, req_class: RequestClass) -> None:  # noqa: B027
        """The instance tells the manager each arriving request's class (BROS's blocks
        place RT and BE requests on opposite sides); ignored by default."""

    def forget(self, req_id: int) -> None:  # noqa: B027
        """The request ended (its KV already freed): drop what :meth:`note_class` kept
        about it; ignored by default."""

    registering: Collection[int] = ()
    """Non-empty while :meth:`retired` wants the batches that end (prefix caching: the
    requests still to cache prompt units); read for its truth only, at every retire. An
    attribute, not a property: a property was a call per iteration (a subclass may still
    define a property; the caching manager then leaves it alone)."""

    def retired(self, batch: Sequence[tuple[Request, int]]) -> None:  # noqa: B027
        """An iteration of ``batch`` ended (called only while :attr:`registering`)."""

    def lookup_prefix(self, req: Request) -> int:
        """``req`` was just queued here holding no KV: take the longest cached prefix of its
        prompt and return its length in tokens, which the request now holds (prefix
        caching, :mod:`~sloserve.engine.prefix_cache`); 0 by default (no cache)."""
        return 0

    def peek_prefix(self, hash_ids: Sequence[int], prompt_tokens: int) -> int:
        """Tokens of a prompt's prefix cached here (GPU and CPU tiers), changing nothing:
        what a cache-aware router reads; 0 by default (no cache)."""
        return 0

    def take_transfer_tokens(self) -> int:
        """KV tokens the manager itself moved between GPU and CPU since the last call
        (BROS's lazy checkpoints and restores), for the instance to price; 0 by default."""
        return 0

    @property
    def capacity_tokens(self) -> int:
        """M in tokens (block-rounded)."""
        return self.num_blocks * self.block_size

    @property
    @abstractmethod
    def num_free_blocks(self) -> int: ...

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @abstractmethod
    def num_tokens(self, req_id: int) -> int:
        """Tokens of KV the request holds on the GPU (0 when it holds none)."""

    @abstractmethod
    def num_request_blocks(self, req_id: int) -> int:
        """Blocks the request holds on the GPU."""

    @abstractmethod
    def blocks_needed(self, req_id: int, n_new_tokens: int) -> int:
        """Extra blocks the request would need to hold ``n_new_tokens`` more tokens."""

    def decode_blocks_needed(self, req_ids: Sequence[int]) -> int:
        """Blocks needed for each of these requests to grow by one token (a decode step).

        Each needs at most one: policies rely on that to admit decodes in bulk.
        """
        return sum(self.blocks_needed(r, 1) for r in req_ids)

    def grow_many(self, req_ids: Sequence[int], n_new_tokens: int) -> bool:
        """Grow every request by ``n_new_tokens``, all or nothing; False if it does not fit."""
        need = sum(self.blocks_needed(r, n_new_tokens) for r in req_ids)
        if need > self.num_free_blocks:
            return False
        for r in req_ids:
            self.allocate(r, n_new_tokens)
        return True

    def max_uniform_growth(
        self, req_ids: Sequence[int], limit: int, free: int | None = None
    ) -> int:
        """Largest k <= ``limit`` such that every request can grow by k tokens at once,
        using at most ``free`` blocks (default: all free blocks).

        The simulator's fast path asks this before advancing k decode steps in one go.
        Generic binary search; managers override it with something faster.
        """
        free = self.num_free_blocks if free is None else free

        def fits(k: int) -> bool:
            return sum(self.blocks_needed(r, k) for r in req_ids) <= free

        if fits(limit):
            return limit
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    @abstractmethod
    def allocate(self, req_id: int, n_new_tokens: int) -> list[int] | None:
        """Grow the request by ``n_new_tokens``; the new blocks, or None (and no change)."""

    @abstractmethod
    def free(self, req_id: int) -> int:
        """Release every GPU block of the request; the number released."""

    @abstractmethod
    def can_swap_out(self, req_id: int) -> bool: ...

    @abstractmethod
    def swap_out(self, req_id: int) -> int:
        """Move the request's KV to the CPU tier; the number of tokens moved."""

    @abstractmethod
    def swap_in_blocks_needed(self, req_id: int) -> int: ...

    @abstractmethod
    def swap_in(self, req_id: int) -> int | None:
        """Bring the request's KV back to the GPU; tokens moved, or None if it does not fit."""

    @abstractmethod
    def drop_swapped(self, req_id: int) -> None:
        """Forget a swapped-out request's CPU copy (it was aborted)."""

    @abstractmethod
    def check_invariants(self) -> None:
        """Raise :class:`KVInvariantError` if any block is lost, duplicated or miscounted."""

    def slot_runs(self, req_id: int) -> list[tuple[int, int]]:
        """The physical cache slots the request's GPU KV occupies, as ``(first slot,
        count)`` runs (slot = block * block_size + offset). Execute mode lays the real KV
        cache out by these (:mod:`sloserve.engine.execute`); a paged manager lists them in
        token order. Required to run a real model on this manager."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its slots")


_shared_ids: list[int] = []
"""Block ids ``0 .. n-1`` as one set of int objects for every paged manager (never
mutated: a larger one replaces it, under :data:`_shared_lock`)."""
_shared_lock = threading.Lock()
_SHARED_MAX = 1 << 20
"""Managers with more blocks build their own ids: the shared list lives as long as the
process, and one of 2**20 ids is ~40 MiB."""


def _block_ids(n: int) -> list[int]:
    """A fresh free list ``n-1 .. 0`` of the int objects every manager shares.

    Moving block ids (allocate, free, a prefix hit) increments and decrements the ids'
    reference counts: with its own ints per manager, 16 replicas' ids are 16 times the
    memory to touch (an 8B model's 28,693 blocks: 0.9 MiB of int objects a replica, past
    a core's L2 cache for 16 of them). Sharing them made the Mooncake run with prefix
    caching ~1.5 % faster (``docs/prefix-caching-history.md``, seventh pass; caching off:
    the same)."""
    global _shared_ids
    if n > _SHARED_MAX:
        return list(range(n - 1, -1, -1))
    ids = _shared_ids
    if len(ids) < n:
        with _shared_lock:  # (a smaller list built meanwhile must not replace a larger one)
            ids = _shared_ids
            if len(ids) < n:
                ids = _shared_ids = list(range(n))
    return ids[n - 1 :: -1]


class PagedKVManager(KVCacheManager):
    """vLLM's paged KV cache: fixed-size blocks, a request's blocks need not be contiguous.

    ``block_size=1`` makes capacity token-exact, as InferMax's M. The arithmetic of the
    per-decision methods (``grow_many``, ``shrink_many``, ``decode_blocks_needed``,
    ``allocate``) is in :mod:`~sloserve.engine.kv_kernels`, which the compiled build
    compiles; this class stays Python, so a subclass may override any of them.
    """

    def __init__(self, num_blocks: int, block_size: int = 16, cpu_blocks: int = 0) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.block_size = block_size
        self.num_blocks = num_blocks
        # Reversed so that blocks are handed out 0, 1, 2, ... (stable, readable traces).
        self._free: list[int] = _block_ids(num_blocks)
        self._tables: dict[int, list[int]] = {}
        self._tokens: dict[int, int] = {}
        self._swapped: dict[int, tuple[int, int]] = {}  # req -> (tokens, blocks) on CPU
        self.cpu = CPUSwapTier(cpu_blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def num_tokens(self, req_id: int) -> int:
        return self._tokens.get(req_id, 0)

    def num_request_blocks(self, req_id: int) -> int:
        table = self._tables.get(req_id)
        return len(table) if table is not None else 0

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def blocks_needed(self, req_id: int, n_new_tokens: int) -> int:
        have = self.num_request_blocks(req_id)
        return max(0, self._blocks_for(self._tokens.get(req_id, 0) + n_new_tokens) - have)

    def allocate(self, req_id: int, n_new_tokens: int) -> list[int] | None:
        if req_id in self._swapped:
            raise KVInvariantError(f"request {req_id} is swapped out: swap it in first")
        return kv_kernels.allocate(
            self._tokens, self._tables, self._free, self.block_size, req_id, n_new_tokens
        )

    def free(self, req_id: int) -> int:
        table = self._tables.pop(req_id, None)
        self._tokens.pop(req_id, None)
        if not table:
            return 0
        self._free.extend(table)
        return len(table)

    can_shrink = True

    def shrink(self, req_id: int, n_tokens: int) -> None:
        tokens = self._tokens[req_id] - n_tokens
        if tokens < 0:
            raise KVInvariantError(f"request {req_id}: cannot shrink by {n_tokens} tokens")
        table = self._tables[req_id]
        extra = len(table) - -(-tokens // self.block_size)  # shrink_blocks, inlined (hot)
        if extra == 1:  # (the common cut, shorter than a block: no slice to build)
            self._free.append(table.pop())
        elif extra > 0:
            # Back on the free list in the order they were taken from it.
            self._free.extend(reversed(table[-extra:]))
            del table[-extra:]
        self._tokens[req_id] = tokens

    def shrink_many(self, req_ids: Sequence[int], n_tokens: int) -> None:
        if type(self).shrink is not PagedKVManager.shrink:
            super().shrink_many(req_ids, n_tokens)  # a subclass's own shrink sees each
            return
        bad = kv_kernels.shrink_many(
            self._tokens, self._tables, self._free, self.block_size, req_ids, n_tokens
        )
        if bad >= 0:
            raise KVInvariantError(f"request {req_ids[bad]}: cannot shrink by {n_tokens} tokens")

    def shrink_blocks(self, req_id: int, n_tokens: int) -> int:
        """The blocks :meth:`shrink` would give back for ``n_tokens``, changing nothing."""
        tokens = self._tokens[req_id] - n_tokens
        return max(0, len(self._tables[req_id]) - -(-tokens // self.block_size))

    def decode_blocks_needed(self, req_ids: Sequence[int]) -> int:
        # A request needs a new block exactly when its last block is full.
        return kv_kernels.decode_blocks_needed(self._tokens, self.block_size, req_ids)

    def grow_many(self, req_ids: Sequence[int], n_new_tokens: int) -> bool:
        return kv_kernels.grow_many(
            self._tokens, self._tables, self._free, self.block_size, req_ids, n_new_tokens
        )

    def max_uniform_growth(
        self, req_ids: Sequence[int], limit: int, free: int | None = None
    ) -> int:
        bs = self.block_size
        free = len(self._free) if free is None else free
        if free < 0:
            return 0
        if free >= len(req_ids) * (limit // bs + 1):
            return limit  # enough even if every request starts on a full block
        tables = self._tables
        tokens = self._tokens
        # Free slots in each request's last block; growing by k needs ceil((k - slack)/bs).
        slack = np.fromiter(
            (len(tables[r]) * bs - tokens[r] if r in tables else 0 for r in req_ids),
            dtype=np.int64,
            count=len(req_ids),
        )

        def need(k: int) -> int:
            return int(np.maximum(0, -((slack - k) // bs)).sum())

        if need(limit) <= free:
            return limit
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if need(mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def slot_runs(self, req_id: int) -> list[tuple[int, int]]:
        table = self._tables.get(req_id)
        if not table:
            return []
        bs = self.block_size
        last = self._tokens[req_id] - (len(table) - 1) * bs
        return [(b * bs, bs) for b in table[:-1]] + [(table[-1] * bs, last)]

    def can_swap_out(self, req_id: int) -> bool:
        return self.num_request_blocks(req_id) <= self.cpu.free_blocks

    def swap_out(self, req_id: int) -> int:
        tokens = self._tokens.get(req_id, 0)
        blocks = self.num_request_blocks(req_id)
        if blocks > self.cpu.free_blocks:
            raise KVInvariantError(f"request {req_id}: CPU swap tier is full")
        self.free(req_id)
        self.cpu.used_blocks += blocks
        self._swapped[req_id] = (tokens, blocks)
        return tokens

    def swap_in_blocks_needed(self, req_id: int) -> int:
        return self._swapped[req_id][1]

    def swap_in(self, req_id: int) -> int | None:
        tokens, blocks = self._swapped[req_id]
        if blocks > len(self._free):
            return None
        del self._swapped[req_id]
        self.cpu.used_blocks -= blocks
        self.allocate(req_id, tokens)
        return tokens

    def drop_swapped(self, req_id: int) -> None:
        entry = self._swapped.pop(req_id, None)
        if entry is not None:
            self.cpu.used_blocks -= entry[1]

    def check_invariants(self) -> None:
        seen: set[int] = set()
        for b in self._free:
            if b in seen:
                raise KVInvariantError(f"block {b} is on the free list twice")
            seen.add(b)
        for req_id, table in self._tables.items():
            for b in table:
                if b in seen:
                    raise KVInvariantError(f"block {b} of request {req_id} is owned twice")
                seen.add(b)
            if len(table) != self._blocks_for(self._tokens[req_id]):
                raise KVInvariantError(
                    f"request {req_id}: {len(table)} blocks for {self._tokens[req_id]} tokens"
                )
        self._check_accounting(seen)

    def _check_accounting(self, seen: Collection[int]) -> None:
        """Every block accounted for exactly once (``seen``: the distinct block ids found
        free or held), and the CPU swap tier's counter equal to what swapped requests hold."""
        if len(seen) != self.num_blocks or (
            seen and (min(seen) < 0 or max(seen) >= self.num_blocks)
        ):
            raise KVInvariantError(f"{len(seen)} blocks accounted for, expected {self.num_blocks}")
        both = self._swapped.keys() & self._tables.keys()
        if both:
            raise KVInvariantError(f"requests {sorted(both)} hold GPU blocks and a CPU copy")
        cpu = sum(b for _t, b in self._swapped.values())
        if cpu != self.cpu.used_blocks or cpu > self.cpu.capacity_blocks:
            raise KVInvariantError(
                f"CPU tier holds {cpu} blocks, counter says {self.cpu.used_blocks}"
            )
