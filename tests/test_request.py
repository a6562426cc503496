import pytest

from sloserve.core.errors import InvalidTransition
from sloserve.core.request import SLO, QoESpec, Request, RequestStatus


def make() -> Request:
    return Request(req_id=1, arrival=1.0, num_prompt_tokens=10, true_output_len=3)


def test_status_is_ordered_and_terminal_states_compare_greater() -> None:
    assert RequestStatus.WAITING < RequestStatus.RUNNING < RequestStatus.FINISHED
    assert RequestStatus.FINISHED.is_terminal and not RequestStatus.PREEMPTED_SWAPPED.is_terminal


def test_transitions_stamp_time_and_assert_previous_state() -> None:
    r = make()
    r.start(1.5)
    assert r.status is RequestStatus.RUNNING and r.first_scheduled == 1.5
    r.num_computed_tokens = 10
    r.preempt_recompute(2.0)
    assert r.num_computed_tokens == 0 and r.num_preemptions == 1
    with pytest.raises(InvalidTransition):
        r.finish(2.1)  # not running
    r.start(2.2)
    assert r.first_scheduled == 1.5  # first admission is kept
    r.preempt_swap(2.3)
    assert r.status is RequestStatus.PREEMPTED_SWAPPED and r.num_swaps == 1
    with pytest.raises(InvalidTransition):
        r.start(2.4)  # swapped requests come back with swap_in
    r.swap_in(2.5)
    r.finish(3.0)
    assert r.finish_time == 3.0 and r.status.is_terminal
    with pytest.raises(InvalidTransition):
        r.abort(3.1)


def test_time_cannot_go_backwards() -> None:
    r = make()
    with pytest.raises(InvalidTransition):
        r.start(0.5)


def test_token_counting_and_phases() -> None:
    r = make()
    assert r.seq_len == 10 and r.remaining_compute == 10 and not r.in_decode
    r.num_computed_tokens = 10
    r.record_tokens(0, 1)  # the prefill emits the first token
    assert r.num_output_tokens == 1 and r.in_decode and r.remaining_compute == 1
    r.num_computed_tokens = 0  # evicted: the refill covers prompt + generated tokens
    assert r.remaining_compute == 11 and not r.in_decode
    assert r.num_prompt_tokens == 10  # the prompt is never rewritten


def test_token_runs_merge_consecutive_iterations() -> None:
    r = make()
    r.record_tokens(3, 1)
    r.record_tokens(4, 2)
    r.record_tokens(9, 1)
    assert r.token_runs == [3, 5, 9, 9]
    assert r.token_iterations() == [3, 4, 5, 9]


def test_invalid_requests_and_specs_are_rejected() -> None:
    with pytest.raises(ValueError):
        Request(req_id=1, arrival=0, num_prompt_tokens=0, true_output_len=1)
    with pytest.raises(ValueError):
        Request(req_id=1, arrival=0, num_prompt_tokens=1, true_output_len=0)
    with pytest.raises(ValueError):
        SLO(ttft_s=-1)
    with pytest.raises(ValueError):
        QoESpec(ttft_s=1, tokens_per_s=0)
    assert SLO().empty and not SLO(tpot_s=0.1).empty
