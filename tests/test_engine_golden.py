"""Hand-computed timelines on tiny cases (constant or simple linear cost models)."""

import numpy as np
import pytest

from helpers import make_instance, req, run, times
from sloserve.core.request import RequestStatus
from sloserve.costmodel.base import ConstantCostModel
from sloserve.costmodel.linear import LinearCoefficients, LinearCostModel


@pytest.mark.parametrize("multi_step", [True, False])
def test_one_request_constant_cost(multi_step: bool) -> None:
    inst = make_instance("vllm", multi_step=multi_step)
    r = req(0, 0.0, 10, 5)
    run(inst, [r])
    assert r.status is RequestStatus.FINISHED
    np.testing.assert_allclose(times(inst, r), [0.01, 0.02, 0.03, 0.04, 0.05])
    assert r.first_token_time == pytest.approx(0.01)  # TTFT: one prefill iteration
    assert r.finish_time == pytest.approx(0.05)
    assert len(inst.iter_end) == 5
    # the fast path priced the four decode steps in one scheduling decision
    assert len(inst.trace.time) == (2 if multi_step else 5)


def test_head_of_line_blocking_under_fcfs() -> None:
    inst = make_instance("vllm", R_max=1)
    a, b = req(0, 0.0, 10, 3), req(1, 0.0, 10, 3)
    run(inst, [a, b])
    np.testing.assert_allclose(times(inst, a), [0.01, 0.02, 0.03])
    np.testing.assert_allclose(times(inst, b), [0.04, 0.05, 0.06])  # waits for a to finish
    # with room for both, they are prefilled together
    inst2 = make_instance("vllm", R_max=2)
    a2, b2 = req(0, 0.0, 10, 3), req(1, 0.0, 10, 3)
    run(inst2, [a2, b2])
    assert times(inst2, b2)[0] == pytest.approx(0.01)


def _linear() -> LinearCostModel:
    # 10 ms per iteration plus 1 ms per token processed
    return LinearCostModel(LinearCoefficients(intercept=0.01, per_token=0.001))


def test_recompute_preemption_and_refill_cost() -> None:
    inst = make_instance("vllm", cost=_linear(), M=14, block_size=1)
    a, b = req(0, 0.0, 5, 6), req(1, 0.0, 5, 6)
    run(inst, [a, b])
    # t=0: both prompts (10 tokens, 20 ms). Two decode steps (12 ms each) fill M=14.
    # t=0.044: a needs a block, b (the later arrival) is evicted; a decodes alone (11 ms).
    # b's refill (5 prompt + 3 generated = 8 tokens) must wait until a finishes at 0.077,
    # then costs 18 ms, and b decodes its last two tokens.
    np.testing.assert_allclose(times(inst, a), [0.02, 0.032, 0.044, 0.055, 0.066, 0.077])
    np.testing.assert_allclose(times(inst, b), [0.02, 0.032, 0.044, 0.095, 0.106, 0.117])
    assert (a.num_preemptions, b.num_preemptions) == (0, 1)
    assert b.num_prompt_tokens == 5 and b.num_output_tokens == 6
    assert inst.num_preemptions == 1 and inst.kv.num_used_blocks == 0


def test_swap_out_and_in_with_transfer_time() -> None:
    cost = ConstantCostModel(0.01, swap_s_per_token=0.001)
    inst = make_instance(
        "vllm", cost=cost, M=14, block_size=1, cpu_blocks=14, params={"preemption_mode": "swap"}
    )
    a, b = req(0, 0.0, 5, 6), req(1, 0.0, 5, 6)
    run(inst, [a, b])
    # t=0.03: b's 7 KV tokens go to the CPU (7 ms on top of the 10 ms iteration);
    # t=0.067: after a finishes, b's KV comes back (7 ms again) and it decodes.
    np.testing.assert_allclose(times(inst, a), [0.01, 0.02, 0.03, 0.047, 0.057, 0.067])
    np.testing.assert_allclose(times(inst, b), [0.01, 0.02, 0.03, 0.084, 0.094, 0.104])
    assert b.num_swaps == 1 and b.num_preemptions == 1 and inst.num_swaps == 1
    assert inst.kv.cpu.used_blocks == 0  # type: ignore[attr-defined]


def test_chunked_prefill_splits_prompt_over_iterations() -> None:
    inst = make_instance("sarathi", P=4)
    r = req(0, 0.0, 10, 2)
    run(inst, [r])
    # 10 prompt tokens in chunks of 4, 4, 2: the first token arrives after 3 iterations
    np.testing.assert_allclose(times(inst, r), [0.03, 0.04])


def test_unservable_requests_are_rejected_not_stalled() -> None:
    inst = make_instance("sarathi", M=100, block_size=1)
    too_long = req(0, 0.0, 90, 20)
    ok = req(1, 0.0, 10, 2)
    run(inst, [too_long, ok])
    assert too_long.status is RequestStatus.REJECTED and "exceeds" in too_long.reject_reason
    assert ok.status is RequestStatus.FINISHED
    inst2 = make_instance("vllm", C=64)  # no chunking: a prompt must fit one batch
    long_prompt = req(0, 0.0, 100, 2)
    run(inst2, [long_prompt])
    assert long_prompt.status is RequestStatus.REJECTED


def test_eviction_free_variant_never_evicts() -> None:
    reqs = [req(i, 0.0, 5, 6) for i in range(4)]
    inst = make_instance("vllm-ef", M=20, block_size=1)
    run(inst, reqs)
    assert inst.num_preemptions == 0
    assert all(r.status is RequestStatus.FINISHED for r in reqs)
    # the same load evicts under plain vLLM
    reqs2 = [req(i, 0.0, 5, 6) for i in range(4)]
    inst2 = make_instance("vllm", M=20, block_size=1)
    run(inst2, reqs2)
    assert inst2.num_preemptions > 0


def test_ranking_policies_serve_short_jobs_first() -> None:
    long_in, short_in = req(0, 0.0, 50, 5), req(1, 0.0, 5, 5)
    inst = make_instance("rank-input", R_max=1)
    run(inst, [long_in, short_in])
    assert short_in.finish_time is not None and long_in.finish_time is not None
    assert short_in.finish_time < long_in.finish_time
    long_out, short_out = req(0, 0.0, 5, 50), req(1, 0.0, 5, 5)
    inst = make_instance("rank-output", R_max=1)
    run(inst, [long_out, short_out])
    assert short_out.finish_time is not None and long_out.finish_time is not None
    assert short_out.finish_time < long_out.finish_time


def test_edf_serves_earliest_deadline_first() -> None:
    from sloserve.core.request import SLO

    def pair() -> tuple:
        # same arrival time; FCFS would take the lax one (lower id) first
        return req(0, 0.0, 5, 20, slo=SLO(deadline_s=100.0)), req(
            1, 0.0, 5, 5, slo=SLO(deadline_s=1.0)
        )

    lax, urgent = pair()
    run(make_instance("edf", R_max=1), [lax, urgent])
    assert urgent.finish_time < lax.finish_time
    lax, urgent = pair()
    run(make_instance("vllm", R_max=1), [lax, urgent])
    assert urgent.finish_time > lax.finish_time


def test_edf_preempts_lower_ranked_request_when_memory_is_short() -> None:
    from sloserve.core.request import SLO

    lax = req(0, 0.0, 8, 10, slo=SLO(deadline_s=100.0))
    urgent = req(1, 0.015, 8, 4, slo=SLO(deadline_s=1.0))
    inst = make_instance("edf", M=20, block_size=1)
    run(inst, [lax, urgent])
    # together they need 28 > 20 tokens: lax, ranked lower, is the one evicted
    assert lax.num_preemptions >= 1 and urgent.num_preemptions == 0
    assert urgent.finish_time < lax.finish_time


@pytest.mark.parametrize("multi_step", [True, False])
def test_tokens_before_the_horizon_are_delivered(multi_step: bool) -> None:
    # one long decode run crossing the horizon: the fast path must not swallow the
    # iterations that ended before it
    inst = make_instance("vllm", multi_step=multi_step)
    r = req(0, 0.0, 10, 1000)
    inst.env.schedule(0.0, lambda: inst.add_request(r), 0)
    inst.env.schedule(1.0, lambda: None, 5)  # the runner's horizon event
    inst.env.run(until=1.0)
    assert inst.abort_all() == 1
    assert r.num_output_tokens == 99  # 0.01 s prefill, then one token every 0.01 s
    assert inst.busy_time == pytest.approx(1.0)


def test_a_reused_instance_ignores_the_stale_completion_of_an_aborted_batch() -> None:
    inst = make_instance("vllm", multi_step=False)
    a = req(0, 0.0, 10, 50)
    inst.env.schedule(0.0, lambda: inst.add_request(a), 0)
    inst.env.run(until=0.005)  # a's prefill is in flight until 0.01
    inst.abort_all()
    b = req(1, 0.006, 10, 3)
    inst.env.schedule(0.006, lambda: inst.add_request(b), 0)
    inst.env.run()
    np.testing.assert_allclose(times(inst, b), [0.016, 0.026, 0.036])


@pytest.mark.parametrize(
    ("policy", "predictor"),
    [("vllm-ef", "constant:2"), ("sarathi-ef", "constant:2"), ("vllm-ef", "constant:200"), ("sarathi-ef", "max-tokens")],
)
def test_eviction_free_variants_survive_wrong_predictions(policy: str, predictor: str) -> None:
    # under-prediction: requests outgrow their reservation and must be evicted, not stall;
    # over-prediction: a reservation larger than M must not block admission forever
    reqs = [req(i, 0.0, 5, 6) for i in range(4)]
    inst = make_instance(policy, M=40, block_size=1, predictor=predictor)
    run(inst, reqs)
    assert all(r.status is RequestStatus.FINISHED for r in reqs)


def test_no_eviction_unless_it_makes_room() -> None:
    from sloserve.core.request import SLO

    # H (urgent) holds 25 of 50 tokens; U needs 40: evicting L (lax) cannot make room,
    # so L is evicted only when H's own growth needs it, not for U's sake every iteration
    inst = make_instance("edf", M=50, block_size=1, params={"watermark": 0.0})
    H = req(0, 0.0, 25, 20, slo=SLO(deadline_s=0.5))
    L = req(1, 0.0, 15, 20, slo=SLO(deadline_s=100))
    U = req(2, 0.005, 40, 5, slo=SLO(deadline_s=1.0))
    run(inst, [H, L, U])
    assert L.num_preemptions <= 1 and H.num_preemptions == 0 and U.num_preemptions == 0


def test_victims_always_rank_below_the_candidate() -> None:
    # decode-first: a low-priority decode must not evict a high-priority partial prefill
    inst = make_instance("sarathi", M=120, P=4, block_size=1, params={"watermark": 0.0, "order": "priority"})
    low = req(0, 0.0, 30, 80, priority=5)
    high = req(1, 0.085, 80, 5, priority=0)
    run(inst, [low, high])
    assert high.num_preemptions == 0
    assert high.finish_time < low.finish_time


def test_swapped_requests_block_new_prompts_under_prefill_priority() -> None:
    # vLLM v0: while anything is swapped out, no new prompt is admitted
    cost = ConstantCostModel(0.01)
    inst = make_instance("vllm", cost=cost, M=14, block_size=1, cpu_blocks=14, params={"preemption_mode": "swap"})
    a, b = req(0, 0.0, 5, 6), req(1, 0.0, 5, 6)
    c = req(2, 0.031, 2, 2)  # arrives while b is swapped out; it would fit
    run(inst, [a, b, c])
    assert b.num_swaps == 1
    assert c.first_scheduled >= a.finish_time  # waited for b to come back in
