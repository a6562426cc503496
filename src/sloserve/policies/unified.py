"""InferMax's unified scheduler (Algorithm 1): one GetNextBatch, many schedulers.

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
* Swapped requests (``preemption_mode=swap``) are resumed before new admissions, as vLLM
  v0 does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

from sloserve.core.request import Request, RequestStatus
from sloserve.engine.interface import (
    InstanceView,
    Limits,
    PreemptionMode,
    ScheduledRequest,
    Scheduler,
    SchedulerOutput,
)

GroupMode = Literal["prefill-first", "decode-first", "single"]
OrderKey = Literal["fcfs", "priority", "edf", "input", "output"]
_INF = float("inf")


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

    def __post_init__(self) -> None:
        if self.eviction_free and self.evict:
            object.__setattr__(self, "evict", False)
        if self.prefill_tokens is not None and self.prefill_tokens < 1:
            raise ValueError("prefill_tokens must be >= 1")


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

    def describe(self) -> dict[str, object]:
        d: dict[str, object] = {"name": self.name}
        d.update({k: (v.value if isinstance(v, PreemptionMode) else v) for k, v in asdict(self.config).items()})
        return d

    def max_sequence_tokens(self, limits: Limits) -> int:
        if self.config.chunked_prefill:
            return limits.kv_capacity_tokens
        # Without chunking a (re)fill must fit one batch, as vLLM's max_model_len <= C.
        return min(limits.max_prefill_tokens, limits.max_batch_tokens, limits.kv_capacity_tokens)

    # -------------------------------------------------------------- ordering
    def _key(self, view: InstanceView) -> Callable[[Request], tuple[float, float, int]] | None:
        order = self.config.order
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

    def _groups(self, view: InstanceView, key: Callable[[Request], tuple[float, float, int]] | None) -> list[Sequence[Request]]:
        def srt(xs: Sequence[Request]) -> Sequence[Request]:
            return sorted(xs, key=key) if key is not None and len(xs) > 1 else xs

        mode = self.config.groups
        if mode == "single":
            allr = [*view.running, *view.swapped, *view.waiting]
            return [sorted(allr, key=key or (lambda r: (r.arrival, 0.0, r.req_id)))]
        if mode == "prefill-first":
            return [srt(view.swapped), srt(view.waiting), srt(view.running)]
        running = srt(view.running)
        return [
            [r for r in running if r.in_decode],
            [r for r in running if not r.in_decode],
            srt(view.swapped),
            srt(view.waiting),
        ]

    # -------------------------------------------------------------- GetNextBatch
    def schedule(self, view: InstanceView) -> SchedulerOutput:  # noqa: C901 - one algorithm
        cfg = self.config
        lim = view.limits
        kv = view.kv
        bs = lim.block_size
        key = self._key(view)
        rank_key = key or (lambda r: (r.arrival, 0.0, r.req_id))
        groups = self._groups(view, key)

        budget_c = lim.max_batch_tokens
        budget_p = lim.max_prefill_tokens
        free_blocks = kv.num_free_blocks
        cpu_free = getattr(getattr(kv, "cpu", None), "free_blocks", 0)
        n_running = len(view.running)
        reserved = 0
        if cfg.eviction_free:
            reserved = sum(max(self._reservation(r, view), kv.num_request_blocks(r.req_id)) for r in view.running)

        batch: list[ScheduledRequest] = []
        in_batch: set[int] = set()
        preempt: list[tuple[Request, PreemptionMode]] = []
        gone: set[int] = set()
        swap_in: list[Request] = []
        batch_decode: bool | None = None
        all_running_in_batch = True
        evict_from = self._victim_order(view, rank_key) if cfg.evict else []

        for group in groups:
            for cand in group:
                rid = cand.req_id
                if rid in gone or rid in in_batch:
                    continue
                st = cand.status
                is_decode = cand.in_decode
                if not cfg.hybrid and batch_decode is not None and batch_decode != is_decode:
                    continue  # step 2: phase mismatch, skip
                # step 3: CanAllocate (token budgets first; these never trigger eviction)
                if is_decode:
                    n = 1
                    if budget_c < 1:
                        break
                else:
                    n = cand.remaining_compute
                    room = min(budget_c, budget_p)
                    if cfg.chunked_prefill:
                        n = min(n, room)
                        if n < 1:
                            break
                    elif n > room:
                        break
                joining = st is not RequestStatus.RUNNING
                if joining and n_running >= lim.max_running:
                    break
                if joining and cfg.eviction_free:
                    res = self._reservation(cand, view)
                    if reserved + res > kv.num_blocks:
                        break
                need = -(-(cand.num_computed_tokens + n) // bs) - kv.num_request_blocks(rid)
                if st is RequestStatus.PREEMPTED_SWAPPED:
                    need = -(-(cand.num_computed_tokens + n) // bs)
                # step 4: evict while M is short and this group may evict
                may_evict = cfg.evict and (not joining or cfg.evict_for_waiting)
                while need > free_blocks and may_evict:
                    victim = self._pick_victim(evict_from, cand, in_batch, gone, rank_key)
                    if victim is None:
                        break
                    mode = cfg.preemption_mode
                    vblocks = kv.num_request_blocks(victim.req_id)
                    if mode is PreemptionMode.SWAP and vblocks > cpu_free:
                        mode = PreemptionMode.RECOMPUTE
                    if mode is PreemptionMode.SWAP:
                        cpu_free -= vblocks
                    preempt.append((victim, mode))
                    gone.add(victim.req_id)
                    free_blocks += vblocks
                    n_running -= 1
                    all_running_in_batch = False
                if need > free_blocks:
                    if st is RequestStatus.RUNNING and may_evict:
                        mode = cfg.preemption_mode
                        vblocks = kv.num_request_blocks(rid)
                        if mode is PreemptionMode.SWAP and vblocks > cpu_free:
                            mode = PreemptionMode.RECOMPUTE
                        if mode is PreemptionMode.SWAP:
                            cpu_free -= vblocks
                        preempt.append((cand, mode))
                        gone.add(rid)
                        free_blocks += vblocks
                        n_running -= 1
                        all_running_in_batch = False
                        continue
                    break  # GotoNextGroup
                # allocate
                free_blocks -= need
                budget_c -= n
                if not is_decode:
                    budget_p -= n
                if joining:
                    n_running += 1
                    if cfg.eviction_free:
                        reserved += self._reservation(cand, view)
                    if st is RequestStatus.PREEMPTED_SWAPPED:
                        swap_in.append(cand)
                        cpu_free += kv.swap_in_blocks_needed(rid)
                batch.append(ScheduledRequest(cand, n))
                in_batch.add(rid)
                if batch_decode is None:
                    batch_decode = is_decode

        if len(in_batch) < len(view.running) or any(not sr.request.in_decode for sr in batch):
            all_running_in_batch = False
        repeatable = bool(batch) and all_running_in_batch and not preempt and not swap_in and all(
            sr.request.status is RequestStatus.RUNNING for sr in batch
        )
        return SchedulerOutput(tuple(batch), tuple(preempt), tuple(swap_in), repeatable)

    # -------------------------------------------------------------- helpers
    def _reservation(self, r: Request, view: InstanceView) -> int:
        """Blocks for I+O-1 tokens, the most the request can ever hold."""
        tokens = r.num_prompt_tokens + max(view.predictor.predict(r), r.num_output_tokens + 1) - 1
        return -(-tokens // view.limits.block_size)

    @staticmethod
    def _victim_order(view: InstanceView, rank_key: Callable[[Request], tuple[float, float, int]]) -> list[Request]:
        """Running requests from the lowest rank up."""
        return sorted(view.running, key=rank_key, reverse=True)

    def _pick_victim(
        self,
        order: list[Request],
        cand: Request,
        in_batch: set[int],
        gone: set[int],
        rank_key: Callable[[Request], tuple[float, float, int]],
    ) -> Request | None:
        single = self.config.groups == "single"
        cand_rank = rank_key(cand) if single else None
        for v in order:
            if v.req_id in gone or v.req_id in in_batch or v is cand:
                continue
            if cand_rank is not None and rank_key(v) <= cand_rank:
                return None  # everything left ranks above the candidate
            return v
        return None
