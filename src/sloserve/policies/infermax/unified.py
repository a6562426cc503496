"""InferMax's unified scheduler (Algorithm 1, §3.1 of ``papers/infermax.txt``): one
GetNextBatch, many schedulers (the named presets are in :mod:`.presets`; the state one
call uses up in :mod:`.batch_state`; the same steps specialised to Sarathi's shape, used
where they apply, in :mod:`.decode_first`).

Steps, as in the paper:

1. **GroupRequests** — order the waiting, running and swapped requests into groups:
   ``prefill-first`` (vLLM: swapped, then waiting, then running), ``decode-first``
   (Sarathi: running decodes, running partial prefills, swapped, waiting) or ``single``
   (one group ranked by ``order``: InferMax A.3's ranking, EDF).
2. **CheckHybridBatching** — without hybrid batching a candidate whose phase (prefill or
   decode) differs from the batch's is skipped.
3. **CanAllocate** — C (tokens per batch), P (prefill tokens per batch; chunked prefill
   trims the candidate to what is left of P), M (KV blocks; eviction-free variants also
   need the reservation of I+O-1 tokens to fit), R_max (running requests).
4. **GotoNextGroupOrEvictContinue** — when M is short and the group may evict, the
   lowest-ranked running request not in the batch is preempted and the candidate retried;
   a running candidate with no victim left evicts itself. Any other failure moves on to
   the next group (head-of-line, as vLLM's FCFS).

Choices where the paper is silent (all parameters of :class:`UnifiedConfig`):

* Within a group, requests are in ``order``: ``fcfs`` (arrival), ``priority`` (lower
  first, then arrival), ``edf`` (absolute deadline: arrival + e2e deadline, else arrival +
  TTFT target, else none), ``input`` or ``output`` (predicted total output) length.
* Victims are chosen lowest-ranked first among running requests not yet in the batch; in
  ``single`` mode a victim must rank below the candidate (no priority inversion).
* Eviction-free variants reserve ``prompt + predicted_output - 1`` tokens per admitted
  request (the paper's I+O-1) using the instance's output-length predictor.
* Swapped requests (``preemption_mode=swap``) are resumed before new admissions. With
  prefill priority no new prompt is admitted while any request is swapped out (vLLM v0's
  default scheduler); with decode priority new prompts still fill the leftover budget
  (vLLM v0's chunked-prefill scheduler).
* A victim always ranks below its candidate (in every group mode), and lower-ranked
  requests are evicted only when evicting all of them would make room.
* Eviction-free variants still evict a running request that outgrew its reservation (a
  predictor under-predicted its output); with the ``oracle`` predictor that never happens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from operator import attrgetter
from typing import Literal

from sloserve.core.request import Request, RequestStatus
from sloserve.engine.interface import (
    InstanceView,
    Limits,
    PreemptionMode,
    ScheduledRequest,
    Scheduler,
    SchedulerOutput,
    scheduler_output,
)
from sloserve.engine.kv import KVCacheManager
from sloserve.policies.infermax import decode_first
from sloserve.policies.infermax.batch_state import State, Victims, settle

GroupMode = Literal["prefill-first", "decode-first", "single"]
OrderKey = Literal["fcfs", "priority", "edf", "input", "output"]
_INF = float("inf")
_new_entry = tuple.__new__


@dataclass(frozen=True)
class UnifiedConfig:
    """Parameters of Algorithm 1 (InferMax Table 1 columns and their variants)."""

    groups: GroupMode = "prefill-first"
    """Which requests are considered first (the Priority column)."""
    hybrid: bool = False
    """Prefill and decode requests in one batch."""
    chunked_prefill: bool = False
    """A prefill may be split over iterations to fit P."""
    prefill_tokens: int | None = None
    """Default P when the user sets none; None means P = C."""
    evict: bool = True
    """Preempt running requests when M is short (False: wait instead)."""
    eviction_free: bool = False
    """Reserve I+O-1 tokens per admitted request so that no eviction is ever needed."""
    preemption_mode: PreemptionMode = PreemptionMode.RECOMPUTE
    order: OrderKey = "fcfs"
    evict_for_waiting: bool = False
    """Whether a waiting candidate may evict lower-ranked running requests."""
    watermark: float = 0.01
    """Fraction of KV blocks an admission must leave free (vLLM's watermark, 1%)."""

    def __post_init__(self) -> None:
        if self.eviction_free and self.evict:
            object.__setattr__(self, "evict", False)
        if self.prefill_tokens is not None and self.prefill_tokens < 1:
            raise ValueError("prefill_tokens must be >= 1")
        if not 0 <= self.watermark < 1:
            raise ValueError("watermark must be in [0, 1)")


def _deadline(r: Request) -> float:
    if r.slo.deadline_s is not None:
        return r.arrival + r.slo.deadline_s
    if r.slo.ttft_s is not None:
        return r.arrival + r.slo.ttft_s
    return _INF


class UnifiedScheduler(Scheduler):
    """Algorithm 1 with a :class:`UnifiedConfig`; the presets are in the registry."""

    def __init__(self, name: str, config: UnifiedConfig) -> None:
        self.name = name
        self.config = config
        self.default_prefill_tokens = config.prefill_tokens
        self._decode_entries: dict[Request, ScheduledRequest] = {}
        """Each running request's ``(request, 1)`` decode entry, built once and reused by
        every batch that decodes it (a named tuple is immutable; building ~20 per decision
        was a tenth of the policy's time)."""

    @property
    def config(self) -> UnifiedConfig:
        """Algorithm 1's parameters (a subclass may replace them: QLM's agent picks its
        preemption mode at its first decision)."""
        return self._config

    @config.setter
    def config(self, config: UnifiedConfig) -> None:
        self._config = config
        # Read by the engine and by the shortcut below: it must follow a replaced config.
        self.chunked_prefill = config.chunked_prefill
        # Whether schedule may answer "every running request decodes" without Algorithm
        # 1's set-up: fcfs (the running list is already in group order), not eviction-free
        # (its reservations ask the predictor, which may keep state).
        self._all_decode_shortcut = (
            config.groups != "single" and config.order == "fcfs" and not config.eviction_free
        )
        # The final chunk repeats (Scheduler.repeats_final_chunk): with the same running
        # requests and nothing waiting or swapped out, _groups gives the same groups in the
        # same order (fcfs; the prompt is still filling); every candidate before the prompt
        # takes the same tokens, so the prompt meets the same room, which its rest fits (it
        # took all of that room before); those after it see more budget than when they
        # passed; free_blocks - promised does not move with the prompt's own chunks (its
        # promise shrinks as its blocks grow) and the decodes' growth was checked to fit,
        # so no candidate meets a shortage (no eviction, no break); R_max and the watermark
        # bind only joining requests. Only the decode-entry cache differs, which no
        # decision reads. Not proven for one ranked group or predictor-reading variants.
        final = self._all_decode_shortcut and config.chunked_prefill
        # The joining chunk repeats (Scheduler.repeats_joined_chunk) with decode priority:
        # the decodes come first, so the prompt met the same room when it joined as it
        # meets as the only filling request next (no other one fills: it would have taken
        # P first); later waiting requests find P used up, as before.
        joined = final and config.groups == "decode-first"
        # A run of decodes repeats (Scheduler.repeats_decode_run): with nothing waiting or
        # swapped out, every running request decoding, C and the free blocks covering one
        # each, the shortcut at the top of schedule answers for all of them, in running
        # order, with no side effect (the decode entries are cached already). The batch
        # promised is the previous one minus the departed, in its order: every all-decode
        # repeatable batch this policy returns holds every running request in running
        # order (fcfs keeps the groups in arrival order; prefill-first puts the running
        # group last, decode-first its decodes first, and a swap-in is no repeatable
        # batch), and the running list only loses requests in between.
        # All three rest on this class's own schedule, _groups, _key and _decode_batch: a
        # subclass may change any of them (QLM's agent keeps state), so only this class
        # sets them; a subclass's own class attributes decide (Scheduler's: False).
        # GetNextBatch specialised to decode-first fcfs hybrid batches (:mod:`.decode_first`):
        # it follows this class's own _groups and _key, so not for a subclass either.
        self._decode_first = (
            type(self) is UnifiedScheduler
            and self._all_decode_shortcut
            and config.groups == "decode-first"
            and config.hybrid
        )
        if type(self) is UnifiedScheduler:
            self.repeats_final_chunk = final
            self.repeats_joined_chunk = joined
            self.repeats_decode_run = self._all_decode_shortcut

    def _decode_batch(self, group: Sequence[Request]) -> tuple[ScheduledRequest, ...]:
        entries = self._decode_entries
        try:
            return tuple(map(entries.__getitem__, group))
        except KeyError:  # (rare: a prompt's final chunk builds its request's entry)
            if len(entries) > 2 * len(group) + 256:  # drop finished requests' entries
                entries.clear()
            for r in group:
                if r not in entries:
                    # tuple.__new__: the named tuple without its Python-level __new__.
                    entries[r] = _new_entry(ScheduledRequest, (r, 1))
            return tuple(map(entries.__getitem__, group))

    def on_finish(self, req: Request, now: float) -> None:
        self._decode_entries.pop(req, None)  # (the request left: its entry is not needed)

    def describe(self) -> dict[str, object]:
        d: dict[str, object] = {"name": self.name}
        d.update(
            {
                k: (v.value if isinstance(v, PreemptionMode) else v)
                for k, v in asdict(self.config).items()
            }
        )
        return d

    def max_sequence_tokens(self, limits: Limits) -> int:
        # vLLM never admits a prompt that would eat into the watermark.
        watermark = int(self.config.watermark * (limits.kv_capacity_tokens // limits.block_size))
        fits = limits.kv_capacity_tokens - watermark * limits.block_size
        if self.config.chunked_prefill:
            return fits
        # Without chunking a (re)fill must fit one batch, as vLLM's max_model_len <= C.
        return min(limits.max_prefill_tokens, limits.max_batch_tokens, fits)

    # -------------------------------------------------------------- ordering
    def _key(self, view: InstanceView) -> Callable[[Request], tuple[float, float, int]] | None:
        order = self._config.order
        if order == "fcfs":
            return None  # the instance keeps every queue in arrival order already
        if order == "priority":
            return lambda r: (r.priority, r.arrival, r.req_id)
        if order == "edf":
            return lambda r: (_deadline(r), r.arrival, r.req_id)
        if order == "input":
            return lambda r: (r.num_prompt_tokens, r.arrival, r.req_id)
        pred = view.predictor
        return lambda r: (pred.predict(r), r.arrival, r.req_id)

    def _groups(
        self,
        view: InstanceView,
        key: Callable[[Request], tuple[float, float, int]] | None,
        filling: list[Request],
    ) -> list[tuple[Sequence[Request], bool]]:
        """The groups in order, each flagged True when it holds only running decodes.

        ``filling``: the running requests part-way through a (re)fill, in arrival order
        (every other running request is decoding).
        """

        def srt(xs: Sequence[Request]) -> Sequence[Request]:
            return sorted(xs, key=key) if key is not None and len(xs) > 1 else xs

        mode = self._config.groups
        if key is None and mode == "decode-first" and not filling:
            # fcfs (every queue is in arrival order already) and nothing filling: the
            # groups below, without their sorting calls (Sarathi's every arrival).
            return [(view.running, True), ([], False), (view.swapped, False), (view.waiting, False)]
        if mode == "single":
            allr = [*view.running, *view.swapped, *view.waiting]
            return [(sorted(allr, key=key or _arrival_rank), False)]
        running = srt(view.running)
        # vLLM v0 admits no new prompt while any request is swapped out.
        waiting = srt(view.waiting) if not view.swapped else []
        if mode == "prefill-first" and not self._config.chunked_prefill:
            # Without chunking every (re)fill completes in one iteration, so between
            # iterations every running request is decoding.
            return [(srt(view.swapped), False), (waiting, False), (running, True)]
        if mode == "prefill-first":
            return [(srt(view.swapped), False), (waiting, False), (running, not filling)]
        decodes: Sequence[Request]
        prefills: Sequence[Request]
        if filling:
            # In the group's order (every key ends with arrival and id: no ties).
            prefills = srt(filling)
            # Usually one or two fill: removing them (in C) beats a second pass.
            decodes = list(running)
            for r in prefills:
                decodes.remove(r)
        else:
            decodes, prefills = running, []
        return [
            (decodes, True),
            (prefills, False),
            (srt(view.swapped), False),
            (srt(view.waiting), False),
        ]

    # -------------------------------------------------------------- GetNextBatch
    def schedule(self, view: InstanceView) -> SchedulerOutput:
        running = view.running
        # Running requests part-way through a (re)fill: every path below reads them.
        fillers = _filling(view) if self.chunked_prefill else []
        if (
            self._all_decode_shortcut
            and running
            and not view.waiting
            and not view.swapped
            and len(running) <= view.limits.max_batch_tokens
            and len(running) <= view.kv.num_free_blocks
            and not fillers
        ):
            # Nothing waits, nothing is swapped out, every running request decodes and
            # each fits whatever block it needs: Algorithm 1 takes the whole decode group
            # at once (the loop below, its groups before it empty); it repeats.
            return scheduler_output(self._decode_batch(running), (), (), True, 0)
        if self._decode_first:  # Sarathi's shape: the same steps, specialised
            out = decode_first.schedule(self, view, fillers)
            if out is not None:
                return out
        cfg = self._config
        lim = view.limits
        kv = view.kv
        key = self._key(view)
        rank_key = key or _arrival_rank
        budget_c = lim.max_batch_tokens
        budget_p = lim.max_prefill_tokens
        bs = lim.block_size
        blocks_needed = kv.blocks_needed
        # Blocks still owed to running requests part-way through a (re)fill: vLLM allocates
        # a prompt's blocks when it is admitted, so they are not free for anyone else.
        # Without chunking there are none: a (re)fill is scheduled whole and completes in
        # its iteration (``_groups`` relies on it too), so no pass over the running set.
        promised: dict[int, int] = {}
        for r in fillers:  # (usually one: a loop, no comprehension's frame)
            rid = r.req_id
            promised[rid] = blocks_needed(
                rid, r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens
            )
        st = State(kv.num_free_blocks - sum(promised.values()), len(view.running), promised)
        watermark = int(cfg.watermark * kv.num_blocks)
        reserved = 0
        if cfg.eviction_free:
            reserved = sum(
                max(self._reservation(r, view), kv.num_request_blocks(r.req_id))
                for r in view.running
            )
        batch: list[ScheduledRequest] = []
        in_batch: set[int] = set()
        # Whole decode groups taken before another group: free_blocks is charged one block
        # per decode (at most what each needs) and their ids are left out of in_batch until
        # something reads either closely (settle): the exact count is a pass over the group
        # and rarely changes a decision (only when M is nearly full).
        unsettled: list[Sequence[Request]] = []
        swap_in: list[Request] = []
        batch_decode: bool | None = None
        running_decodes = steady_prefills = repeat_reserve = 0
        # Eviction-free variants evict only a running request that outgrew its reservation
        # (a predictor that under-predicted): waiting forever would stall the replica.
        can_evict = cfg.evict or cfg.eviction_free
        victims: Victims | None = None  # built at the first eviction (most calls have none)
        # One ranked group has no "next group": a candidate that cannot run is skipped.
        skip_on_fail = cfg.groups == "single"
        hybrid = cfg.hybrid
        chunked = cfg.chunked_prefill
        RUNNING = RequestStatus.RUNNING
        SWAPPED = RequestStatus.PREEMPTED_SWAPPED

        groups = self._groups(view, key, fillers)
        last = len(groups) - 1
        for gi, (group, all_decode) in enumerate(groups):
            if all_decode and not hybrid and batch_decode is False:
                continue  # step 2 for every candidate: decodes do not join a prefill batch
            if unsettled and all_decode and st.free_blocks < len(group):
                settle(unsettled, st, in_batch, kv)  # the test below needs the exact count
            if (
                all_decode
                and group
                and (hybrid or batch_decode is not False)
                and budget_c >= len(group)
                and st.free_blocks >= len(group)
                and not st.gone
            ):
                # Every candidate fits whatever its block needs (at most one each): take the
                # whole group at once. Same result as the loop below, a fraction of the cost.
                if gi != last:
                    # (The last group, vLLM's running decodes: nothing after it reads the
                    # blocks left or what is in the batch, so neither is walked for.)
                    st.free_blocks -= len(group)
                    unsettled.append(group)
                budget_c -= len(group)
                batch.extend(self._decode_batch(group))
                running_decodes += len(group)
                batch_decode = batch_decode if batch_decode is not None else True
                continue
            for cand in group:
                rid = cand.req_id
                if rid in st.gone:
                    continue
                status = cand.status
                n_out = cand.num_output_tokens
                remaining = cand.num_prompt_tokens + n_out - cand.num_computed_tokens
                is_decode = n_out > 0 and remaining == 1
                if not hybrid and batch_decode is not None and batch_decode is not is_decode:
                    continue  # step 2: phase mismatch
                # step 3: CanAllocate. Token budgets and R_max never trigger eviction.
                if is_decode:
                    n = 1
                    ok = budget_c >= 1
                else:
                    room = budget_c if budget_c < budget_p else budget_p
                    n = min(remaining, room) if chunked else remaining
                    ok = 1 <= n <= room
                joining = status is not RUNNING
                if ok and joining:
                    ok = st.n_running < lim.max_running
                    if ok and cfg.eviction_free:
                        ok = reserved + self._reservation(cand, view) <= kv.num_blocks
                if not ok:
                    if skip_on_fail:
                        continue
                    break
                # M: a decode needs its next token's block; a prefill its whole remaining
                # prompt (InferMax: "input size for prefill"), as vLLM allocates it at once.
                if status is SWAPPED:
                    need = -(-(cand.num_computed_tokens + remaining) // bs)
                elif is_decode:
                    need = blocks_needed(rid, 1)
                else:
                    need = st.promised.pop(rid, 0) or blocks_needed(rid, remaining)
                    if status is RUNNING:
                        st.free_blocks += need  # it was counted as promised
                margin = watermark if joining else 0
                if unsettled and need + margin > st.free_blocks:
                    settle(unsettled, st, in_batch, kv)  # short by the bound: count exactly
                # step 4: evict lower-ranked running requests while M is short, but only
                # when evicting them all would make room (no eviction for nothing)
                if need + margin > st.free_blocks:
                    may_evict = can_evict and (not joining or cfg.evict_for_waiting)
                    if may_evict:
                        if victims is None:
                            victims = Victims(view, rank_key)
                        room = st.free_blocks + victims.capacity(cand, in_batch, st, kv)
                        while need + margin > st.free_blocks and room >= need + margin:
                            victim = victims.pick(cand, in_batch, st.gone)
                            if victim is None:
                                break
                            self._evict(victim, kv, st)
                    if need + margin > st.free_blocks:
                        if status is RUNNING and may_evict:
                            self._evict(cand, kv, st)
                            continue
                        if status is RUNNING and not is_decode:
                            st.free_blocks -= need  # still promised to it
                        if skip_on_fail:
                            continue
                        break  # GotoNextGroup
                st.free_blocks -= need
                budget_c -= n
                if not is_decode:
                    budget_p -= n
                if joining:
                    st.n_running += 1
                    if cfg.eviction_free:
                        reserved += self._reservation(cand, view)
                    if status is SWAPPED:
                        # No CPU credit: the engine swaps out before it swaps in.
                        swap_in.append(cand)
                batch.append(_new_entry(ScheduledRequest, (cand, n)))  # (no Python __new__)
                in_batch.add(rid)
                if n == remaining and not is_decode:
                    # Its final chunk: it decodes next. Its decode entry is built now (a
                    # miss in _decode_batch costs an exception and a walk of the group).
                    # Not gated on the output length, which a policy must not read: a
                    # request that stops at its first token drops the entry at finish.
                    self._decode_entries[cand] = _new_entry(ScheduledRequest, (cand, 1))
                if not joining:
                    if is_decode:
                        running_decodes += 1
                    elif n < remaining:
                        # a non-final chunk took what was left of the budget: the same
                        # chunk of the same prompt comes next, with its blocks promised
                        steady_prefills += 1
                        repeat_reserve += need
                if batch_decode is None:
                    batch_decode = is_decode

        # Repeatable: every running request is in the batch, decoding or taking a non-final
        # chunk that used up the budget, and nothing was evicted. Requests that did not fit
        # now cannot fit in the next iterations: budgets stay used up and KV use only grows.
        repeatable = (
            bool(batch)
            and not st.preempt
            and running_decodes + steady_prefills == len(batch) == len(view.running)
        )
        return scheduler_output(
            tuple(batch), tuple(st.preempt), tuple(swap_in), repeatable, repeat_reserve
        )

    def _evict(self, victim: Request, kv: KVCacheManager, st: State) -> None:
        mode = self._config.preemption_mode
        blocks = kv.num_request_blocks(victim.req_id)
        if st.cpu_free < 0:  # read at the first eviction (the tier does not change here)
            st.cpu_free = getattr(getattr(kv, "cpu", None), "free_blocks", 0)
        if mode is PreemptionMode.SWAP and blocks > st.cpu_free:
            mode = PreemptionMode.RECOMPUTE  # the CPU tier is full
        if mode is PreemptionMode.SWAP:
            st.cpu_free -= blocks
        st.preempt.append((victim, mode))
        st.gone.add(victim.req_id)
        st.free_blocks += blocks + st.promised.pop(victim.req_id, 0)
        st.n_running -= 1

    # -------------------------------------------------------------- helpers
    def _reservation(self, r: Request, view: InstanceView) -> int:
        """Blocks for I+O-1 tokens, the most the request can ever hold (capped at what the
        policy can hold at all, so an over-predicting predictor cannot block admission)."""
        tokens = r.num_prompt_tokens + max(view.predictor.predict(r), r.num_output_tokens + 1) - 1
        tokens = min(tokens, self.max_sequence_tokens(view.limits))
        return -(-tokens // view.limits.block_size)


def _filling(view: InstanceView) -> list[Request]:
    """The running requests part-way through a (re)fill, in arrival order: from the
    engine's small superset (:attr:`InstanceView.filling`) when it keeps one, else from
    every running request."""
    src = view.filling
    if src is None:
        return [
            r
            for r in view.running
            if r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens != 1
            or not r.num_output_tokens
        ]
    if not src:
        return []
    me = view.instance_id
    RUNNING = RequestStatus.RUNNING
    found: list[Request] = []
    for r in src:  # (one or two: a loop, no comprehension's frame, at every decision)
        if (
            r.status is RUNNING
            and r.instance_id == me
            and (
                r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens != 1
                or not r.num_output_tokens
            )
        ):
            found.append(r)
    if len(found) > 1:
        found.sort(key=_ARRIVAL)  # the order of the running list
    return found


_ARRIVAL = attrgetter("arrival", "req_id")


def _arrival_rank(r: Request) -> tuple[float, float, int]:
    return (r.arrival, 0.0, r.req_id)
