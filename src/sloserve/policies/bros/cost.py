"""What a BROS batch costs: its iteration time and the KV it brings back from the CPU.

BROS §4.1 (eq. 5): the iteration time the policy predicts, and the engine charges
(``overlap_swap``), is ``max(execution, swap)``, since transfers are asynchronous. The
predicted swap covers what comes back from the CPU for the batch (eq. 5's ``M^cpu``:
swapped requests' whole KV, BE requests' checkpointed slots) and the swap-outs of
progressive dropping; the lazy checkpoints of overwritten BE slots are charged by the
engine but not predicted (they depend on placement, and are at most the RT requests' new
tokens).
"""

from __future__ import annotations

from sloserve.core.request import Request, RequestStatus
from sloserve.costmodel.base import BatchStats, CostModel
from sloserve.engine.kv import KVCacheManager

_SWAPPED = RequestStatus.PREEMPTED_SWAPPED


class _Cost:
    """The batch's :class:`BatchStats`, kept incrementally so that adding or removing a
    candidate and re-pricing is O(1)."""

    __slots__ = ("cm", "ctx", "n_decode", "n_pf_seqs", "overlap", "pf_tokens", "swap", "work")

    def __init__(self, cm: CostModel, overlap: bool) -> None:
        self.cm = cm
        self.overlap = overlap
        self.pf_tokens = self.n_pf_seqs = self.work = self.n_decode = self.ctx = self.swap = 0

    def add(self, r: Request, n: int, swap_tokens: int, sign: int = 1) -> None:
        if _is_decode(r):
            self.n_decode += sign
            self.ctx += sign * r.num_computed_tokens
        else:
            self.pf_tokens += sign * n
            self.n_pf_seqs += sign
            self.work += sign * n * (n + r.num_computed_tokens)
        self.swap += sign * swap_tokens

    def time(self, r: Request | None = None, n: int = 0, swap_tokens: int = 0) -> float:
        """The batch's time, with ``r`` processing ``n`` tokens added when given."""
        pf, seqs, work, dec, ctx = (
            self.pf_tokens,
            self.n_pf_seqs,
            self.work,
            self.n_decode,
            self.ctx,
        )
        if r is not None:
            if _is_decode(r):
                dec += 1
                ctx += r.num_computed_tokens
            else:
                pf += n
                seqs += 1
                work += n * (n + r.num_computed_tokens)
        ex = self.cm.batch_time(
            BatchStats(
                num_prefill_tokens=pf,
                num_prefill_seqs=seqs,
                prefill_attn_work=work,
                num_decode=dec,
                decode_context_sum=ctx,
            )
        )
        sw = self.cm.swap_time(self.swap + swap_tokens)
        return max(ex, sw) if self.overlap else ex + sw


def _transfer_in(kv: KVCacheManager, r: Request) -> int:
    """KV tokens that come back from the CPU when ``r`` runs (eq. 5's M^cpu, in tokens): a
    swapped request's whole KV, else its lazily checkpointed slots (none on paged blocks)."""
    if r.status is _SWAPPED:
        return r.num_computed_tokens
    ckpt = getattr(kv, "checkpointed_tokens", None)
    return ckpt(r.req_id) if ckpt is not None else 0


def _is_decode(r: Request) -> bool:
    n_out = r.num_output_tokens
    return n_out > 0 and r.num_prompt_tokens + n_out - r.num_computed_tokens == 1
