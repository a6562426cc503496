from hypothesis import given, settings
from hypothesis import strategies as st

from sloserve.engine.kv import PagedKVManager


def test_allocate_rounds_up_to_blocks_and_is_atomic() -> None:
    kv = PagedKVManager(num_blocks=4, block_size=4)
    assert kv.allocate(1, 5) is not None
    assert kv.num_request_blocks(1) == 2 and kv.num_tokens(1) == 5
    assert kv.blocks_needed(1, 3) == 0 and kv.blocks_needed(1, 4) == 1
    assert kv.allocate(2, 9) is None  # needs 3, only 2 free: nothing changes
    assert kv.num_free_blocks == 2 and kv.num_tokens(2) == 0
    assert kv.free(1) == 2 and kv.num_free_blocks == 4
    kv.check_invariants()


def test_swap_moves_blocks_to_cpu_and_back() -> None:
    kv = PagedKVManager(num_blocks=4, block_size=2, cpu_blocks=2)
    kv.allocate(1, 3)
    assert kv.can_swap_out(1)
    assert kv.swap_out(1) == 3
    assert kv.num_free_blocks == 4 and kv.cpu.used_blocks == 2
    kv.allocate(2, 7)  # the GPU fills up
    assert kv.swap_in(1) is None
    kv.free(2)
    assert kv.swap_in(1) == 3 and kv.num_tokens(1) == 3 and kv.cpu.used_blocks == 0
    kv.check_invariants()


def test_bulk_growth_helpers_agree_with_single_allocations() -> None:
    kv = PagedKVManager(num_blocks=10, block_size=4)
    for r, n in ((1, 4), (2, 5), (3, 7)):
        kv.allocate(r, n)
    assert kv.decode_blocks_needed([1, 2, 3]) == 1  # only request 1's last block is full
    assert kv.max_uniform_growth([1, 2, 3], 100) == 7  # 2 + 1 + 2 new blocks
    assert kv.grow_many([1, 2, 3], 7)
    assert kv.num_free_blocks == 0 and not kv.grow_many([1], 2)  # 11 tokens + 2 > 3 blocks
    kv.check_invariants()


@settings(max_examples=60, deadline=None)
@given(
    block_size=st.integers(1, 8),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["alloc", "free", "swap_out", "swap_in", "grow"]),
            st.integers(0, 5),
            st.integers(1, 20),
        ),
        max_size=60,
    ),
)
def test_blocks_are_conserved_under_any_operation_sequence(
    block_size: int, ops: list[tuple[str, int, int]]
) -> None:
    kv = PagedKVManager(num_blocks=16, block_size=block_size, cpu_blocks=8)
    swapped: set[int] = set()
    for op, rid, n in ops:
        if op == "alloc" and rid not in swapped:
            kv.allocate(rid, n)
        elif op == "free" and rid not in swapped:
            kv.free(rid)
        elif (
            op == "swap_out" and rid not in swapped and kv.num_tokens(rid) and kv.can_swap_out(rid)
        ):
            kv.swap_out(rid)
            swapped.add(rid)
        elif op == "swap_in" and rid in swapped and kv.swap_in(rid) is not None:
            swapped.discard(rid)
        elif op == "grow":
            live = [r for r in range(6) if kv.num_tokens(r) and r not in swapped]
            k = kv.max_uniform_growth(live, n)
            assert kv.grow_many(live, k)
        kv.check_invariants()
        used = sum(kv.num_request_blocks(r) for r in range(6))
        assert used + kv.num_free_blocks == 16


def test_a_swapped_request_cannot_grow_on_the_gpu() -> None:
    import pytest

    from sloserve.engine.kv import KVInvariantError

    kv = PagedKVManager(num_blocks=4, block_size=2, cpu_blocks=4)
    kv.allocate(1, 3)
    kv.swap_out(1)
    with pytest.raises(KVInvariantError):
        kv.allocate(1, 1)


def test_grow_many_hands_out_the_blocks_allocate_would() -> None:
    # grow_many reads a request's table only when its last block's free slots do not
    # cover the growth; the blocks and their order must be allocate's, one by one.
    import random

    rng = random.Random(5)
    for _ in range(300):
        bs = rng.choice([1, 2, 4, 16])
        a, b = PagedKVManager(400, block_size=bs), PagedKVManager(400, block_size=bs)
        ids = list(range(rng.randint(1, 8)))
        for r in ids:
            t = rng.randint(1, 40)
            a.allocate(r, t)
            b.allocate(r, t)
        n = rng.randint(1, 3 * bs + 1)
        assert a.grow_many(ids, n)
        for r in ids:
            assert b.allocate(r, n) is not None
        a.check_invariants()
        assert a._tables == b._tables and a._free == b._free and a._tokens == b._tokens


def test_shrink_many_is_shrink_in_order() -> None:
    import random

    rng = random.Random(5)
    for bs in (1, 4, 16):
        a, b = PagedKVManager(2000, bs), PagedKVManager(2000, bs)
        ids = list(range(12))
        for r in ids:
            n = rng.randint(1, 60)
            a.allocate(r, n)
            b.allocate(r, n)
        assert a.grow_many(ids, 9) and b.grow_many(ids, 9)
        for cut in (3, 6):
            a.shrink_many(ids[::-1], cut)
            for r in ids[::-1]:
                b.shrink(r, cut)
            assert a._free == b._free and a._tables == b._tables and a._tokens == b._tokens
            a.check_invariants()


def test_shrink_many_stops_at_a_request_holding_too_little() -> None:
    """The cut stops where :meth:`shrink` in order would raise: the requests before it
    shrunk, it and the rest untouched, the error naming it."""
    import pytest

    from sloserve.engine.kv import KVInvariantError

    a, b = PagedKVManager(100, 4), PagedKVManager(100, 4)
    for kv in (a, b):
        for r, n in ((1, 9), (2, 3), (3, 9)):
            kv.allocate(r, n)
    with pytest.raises(KVInvariantError, match="request 2: cannot shrink by 5"):
        a.shrink_many([1, 2, 3], 5)
    b.shrink(1, 5)
    with pytest.raises(KVInvariantError, match="request 2: cannot shrink by 5"):
        b.shrink(2, 5)
    assert (a._free, a._tables, a._tokens) == (b._free, b._tables, b._tokens)
    assert a.num_tokens(1) == 4 and a.num_tokens(3) == 9
    a.check_invariants()


def test_shrink_undoes_a_growth_exactly() -> None:
    """Growing then shrinking (in reverse order) by at most a block's tokens gives back
    the very blocks, to the free list's very places (a block or none each: the common
    cut, which gives its block back without a slice)."""
    import random

    rng = random.Random(7)
    for bs in (1, 4, 16):
        for n in sorted({1, max(1, bs - 1), bs}):
            for many in (True, False):
                kv = PagedKVManager(4000, bs)
                ids = list(range(10))
                for r in ids:
                    kv.allocate(r, rng.randint(1, 60))
                before = (list(kv._free), {r: list(t) for r, t in kv._tables.items()})
                tokens = dict(kv._tokens)
                assert kv.grow_many(ids, n)
                if many:
                    kv.shrink_many(ids[::-1], n)
                else:
                    for r in ids[::-1]:
                        kv.shrink(r, n)
                assert (kv._free, kv._tables, kv._tokens) == (*before, tokens), (bs, n, many)
                kv.check_invariants()


def test_shrink_many_calls_a_subclass_shrink() -> None:
    seen: list[tuple[int, int]] = []

    class Watched(PagedKVManager):
        def shrink(self, req_id: int, n_tokens: int) -> None:
            seen.append((req_id, n_tokens))
            super().shrink(req_id, n_tokens)

    kv = Watched(50, 4)
    kv.allocate(1, 10)
    kv.allocate(2, 10)
    kv.shrink_many([2, 1], 3)
    assert seen == [(2, 3), (1, 3)] and kv.num_tokens(1) == kv.num_tokens(2) == 7


def test_grow_many_that_does_not_fit_changes_nothing() -> None:
    kv = PagedKVManager(num_blocks=4, block_size=4)
    kv.allocate(1, 4)
    kv.allocate(2, 7)
    before = (dict(kv._tokens), {r: list(t) for r, t in kv._tables.items()}, list(kv._free))
    assert not kv.grow_many([1, 2], 5)  # 1 needs 2 more blocks, 2 needs 1: one is free
    assert (kv._tokens, kv._tables, kv._free) == before
    kv.check_invariants()


def test_blocks_needed_asks_a_subclass_own_count() -> None:
    # A subclass overriding num_request_blocks or _blocks_for (and not blocks_needed)
    # gets answers from its own count; one overriding blocks_needed keeps its own.
    class Reserved(PagedKVManager):
        def num_request_blocks(self, req_id: int) -> int:
            return super().num_request_blocks(req_id) + 1  # one block held aside

    class Own(Reserved):
        def blocks_needed(self, req_id: int, n_new_tokens: int) -> int:
            return 42

    class Below(Own):  # its parent's own blocks_needed stays
        def _blocks_for(self, tokens: int) -> int:
            return 0

    for cls, want in ((PagedKVManager, 2), (Reserved, 1), (Own, 42), (Below, 42)):
        kv = cls(num_blocks=8, block_size=4)
        kv.allocate(1, 4)
        assert kv.blocks_needed(1, 5) == want, cls.__name__


def test_paged_managers_share_their_block_id_ints() -> None:
    # One set of int objects for every manager (engine/kv.py, _block_ids): fewer objects
    # to touch when ids move; each manager still owns its free list.
    from sloserve.engine import kv as kv_module

    a, b = PagedKVManager(2000), PagedKVManager(1500)
    assert a._free == list(range(1999, -1, -1)) and b._free == list(range(1499, -1, -1))
    assert all(x is y for x, y in zip(a._free[-1500:], b._free, strict=True))
    a.allocate(0, 16)
    assert len(b._free) == 1500  # not shared: the lists
    big = kv_module._SHARED_MAX + 1
    assert kv_module._block_ids(big)[0] == big - 1  # its own list above the cap
    assert len(kv_module._shared_ids) <= kv_module._SHARED_MAX


def test_a_caching_manager_subclass_may_keep_registering_a_property() -> None:
    from sloserve.engine.prefix_cache import PrefixCachingKVManager

    class Own(PrefixCachingKVManager):
        @property  # type: ignore[override]
        def registering(self) -> tuple[int, ...]:
            return ()

    assert Own(64, 16).registering == ()
    plain = PrefixCachingKVManager(64, 16)
    assert plain.registering is plain._open  # the attribute: its open requests' dict
