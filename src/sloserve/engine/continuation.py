"""The engine's continuation: running decodes it has already checked, carried to the next
decision so that a batch derived from the previous one is checked only where it differs.

Most decisions schedule the same running decodes as the one before, minus the requests
that finished and plus a request or two that joined (an arrival's prefill ends, a finish
ends a run): vLLM's next decode run, Sarathi's hybrid step (every decode plus a new
prompt). Walking all of them again (the fast path's plan, a single step's checks) was the
largest per-decision cost left. After an iteration retires, the instance keeps a
:class:`Continuation`: the batch entries of running one-token decodes, in batch order, with
the two figures the engine needs about them (their context sum and the fewest tokens any
still has to generate). When the policy's next batch *starts with exactly those entries*
(one C-level tuple comparison: a policy reusing its entries compares by identity), those
entries need no check: each is running here, decodes one token and appears once, and the
figures are exact. Only the entries after them are checked, as before, including against
duplicates of the checked ones; a batch that does not start with them is checked whole.

The guarantee rests on an invariant, verified under the engine's invariant checks
(:func:`verify`): while :attr:`Instance._cont` is set, nothing but the engine's own step
changed those requests. Every other path that touches a running request drops it (a
preemption or swap in the output, an abort, a hand-off, a failure, the horizon, an
empty decision), and a step whose batch holds none of them (vLLM's prefill step: no
one-token decode at all) leaves it as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sloserve.core.request import Request, RequestStatus
from sloserve.engine.interface import ScheduledRequest
from sloserve.engine.kv import KVInvariantError

if TYPE_CHECKING:
    from sloserve.engine.instance import Instance


class Continuation:
    """Checked running decodes: ``entries`` (``(request, 1)`` batch entries, in batch
    order, none twice), their ``ids``, ``ctx`` (the sum of their ``num_computed_tokens``)
    and ``left`` (the fewest tokens any of them has still to generate: the smallest
    ``true_output_len - num_output_tokens``, exact, as the fast path's run length
    depends on it)."""

    __slots__ = ("ctx", "entries", "ids", "left")

    def __init__(
        self, entries: tuple[ScheduledRequest, ...], ids: list[int], ctx: int, left: int
    ) -> None:
        self.entries = entries
        self.ids = ids
        self.ctx = ctx
        self.left = left


def lead(cont: Continuation | None, batch: Sequence[ScheduledRequest]) -> int:
    """How many leading entries of ``batch`` ``cont`` has checked: all of them or 0.

    Only a tuple batch is compared: a list (or another sequence) may be the very object a
    policy returned before and has since edited, or compare equal by its own ``__eq__``.
    Entries are :class:`ScheduledRequest` tuples, immutable by the interface's type."""
    if cont is None or batch.__class__ is not tuple:
        return 0
    entries = cont.entries
    n = len(entries)
    if batch is entries:  # (the batch promised again: :mod:`.decode_run`)
        return n
    return n if batch[:n] == entries else 0


def verify(inst: Instance) -> None:
    """The continuation's invariant (module docstring), or raise :class:`KVInvariantError`."""
    cont = inst._cont
    if cont is None:
        return
    me = inst.instance_id
    ids = [r.req_id for r, _n in cont.entries]
    if ids != cont.ids or len(set(ids)) != len(ids):
        raise KVInvariantError(f"continuation ids {cont.ids} are not its entries' {ids}")
    running = {id(r) for r in inst.running}
    ctx = 0
    left = min((r.true_output_len - r.num_output_tokens for r, _n in cont.entries), default=0)
    for r, n in cont.entries:
        n_out = r.num_output_tokens
        if (
            n != 1
            or r.status is not RequestStatus.RUNNING
            or r.instance_id != me
            or id(r) not in running
            or not n_out
            or r.num_prompt_tokens + n_out - r.num_computed_tokens != 1
        ):
            raise KVInvariantError(f"continuation entry {r.req_id} is not a running decode")
        ctx += r.num_computed_tokens
    if not cont.entries or ctx != cont.ctx or left != cont.left:
        raise KVInvariantError(
            f"continuation of {len(ids)} entries says context {cont.ctx}, {cont.left} left; "
            f"they hold {ctx}, {left} left"
        )


_NONE_LEFT = 1 << 62


def deliver(inst: Instance, dec: Continuation, k: int, first: int, finished: list[Request]) -> None:
    """Deliver ``k`` iterations (the first at ``first`` in ``iter_end``) to ``dec``'s
    entries, one token each per iteration; append those that finish to ``finished`` (in
    batch order) and make the rest the instance's continuation.

    The same updates as the instance's own delivery loop; while ``k`` is below the
    fewest tokens any of them has left, none finishes, so none is tested."""
    entries = dec.entries
    prev = first - 1  # a run of tokens ending there is extended, not restarted
    last = first + k - 1
    if k < dec.left:
        for r, _n in entries:
            r.num_computed_tokens += k
            r.num_output_tokens += k
            runs = r.token_runs  # inlined Request.record_tokens: this is the hot loop
            if runs and runs[-1] == prev:
                runs[-1] = last
            else:
                runs.append(first)
                runs.append(last)
        inst._cont = Continuation(entries, dec.ids, dec.ctx + k * len(entries), dec.left - k)
        return
    left = _NONE_LEFT
    n_before = len(finished)
    for r, _n in entries:
        r.num_computed_tokens += k
        n_out = r.num_output_tokens + k
        r.num_output_tokens = n_out
        runs = r.token_runs
        if runs and runs[-1] == prev:
            runs[-1] = last
        else:
            runs.append(first)
            runs.append(last)
        rest = r.true_output_len - n_out
        if rest <= 0:
            finished.append(r)
        elif rest < left:
            left = rest
    if left == _NONE_LEFT:  # every one finished
        inst._cont = None
        return
    gone = finished[n_before:]
    ctx = dec.ctx + k * len(entries)
    kept, ids = entries, dec.ids
    for r in gone:  # (usually one: cut out by position, no walk in Python)
        ctx -= r.num_computed_tokens
        i = ids.index(r.req_id)
        kept = kept[:i] + kept[i + 1 :]
        ids = ids[:i] + ids[i + 1 :]
    inst._cont = Continuation(kept, ids, ctx, left)
