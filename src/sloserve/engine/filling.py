"""The running requests that may still be part-way through a (re)fill, kept by the engine.

Policies with chunked prefill need, every decision, the running requests not yet decoding
(InferMax's promised blocks, Sarathi's decode/fill split); walking all running requests
for the one or two that fill was a measurable part of a decision. The instance keeps a
small superset instead (:attr:`Instance.filling`, shown to policies as
:attr:`~sloserve.engine.interface.InstanceView.filling`):

* a request is noted when it joins the running set needing a (re)fill (admission,
  swap-in, a prefilled request's arrival: :func:`note_joined`);
* it is dropped at an iteration's end once it decodes or is no longer running here
  (:func:`prune`): a fill completes only when an iteration retires, and a running
  request that decodes never fills again without leaving the running set first.

So every running request still filling is in it (what :func:`check` verifies under the
engine's invariant checks); entries may be stale between iterations (a request aborted
or preempted since), so a reader re-tests each one.
"""

from __future__ import annotations

from collections.abc import Sequence

from sloserve.core.request import Request, RequestStatus
from sloserve.engine.kv import KVInvariantError


def note_joined(filling: dict[int, Request], r: Request) -> None:
    """``r`` joined the running set: note it if it needs a (re)fill."""
    n_out = r.num_output_tokens
    if not n_out or r.num_prompt_tokens + n_out - r.num_computed_tokens != 1:
        filling[r.req_id] = r


def prune(filling: dict[int, Request], instance_id: int) -> None:
    """Drop the requests now decoding or no longer running on ``instance_id``."""
    RUNNING = RequestStatus.RUNNING
    # A loop over a copy, not a comprehension: the dict holds one or two requests, and a
    # comprehension's own frame cost more than its work (once per iteration retired).
    for rid, r in list(filling.items()):
        if (
            r.status is not RUNNING
            or r.instance_id != instance_id
            or (
                r.num_output_tokens
                and r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens == 1
            )
        ):
            del filling[rid]


def check(filling: dict[int, Request], running: Sequence[Request]) -> None:
    """Every running request part-way through a fill is in ``filling``, or raise."""
    missing = [
        r.req_id
        for r in running
        if r.req_id not in filling
        and (
            not r.num_output_tokens
            or r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens != 1
        )
    ]
    if missing:
        raise KVInvariantError(f"running requests {missing} fill but are not in `filling`")
