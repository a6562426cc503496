"""State the engine keeps so that the policy need not re-derive it each decision:
``Instance.filling`` (engine/filling.py: the running requests that may still be
filling) gives the very requests a walk of the whole running set gives, at every
decision, through preemptions (recompute and swap), failures, disaggregated hand-offs and
prefix hits; InferMax's all-decode shortcut answers what Algorithm 1 answers."""

from __future__ import annotations

from typing import Any

import pytest

import sloserve.policies.infermax.unified as unified
from helpers import small_linear_cost
from sloserve.cluster import ClusterConfig
from sloserve.core.predictor import make_predictor
from sloserve.core.request import Request
from sloserve.engine import filling as fills
from sloserve.engine.env import PRIO_ARRIVAL, Environment
from sloserve.engine.instance import Instance
from sloserve.engine.interface import InstanceView, Limits
from sloserve.engine.kv import KVInvariantError
from sloserve.experiments.cluster_run import simulate_cluster
from sloserve.experiments.runner import InstanceConfig, SimConfig
from sloserve.policies.registry import make_policy
from sloserve.workloads import PoissonArrivals, WorkloadSpec


def _checked_filling(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make every decision compare the superset's answer with a walk of all running."""
    real = unified._filling
    calls = [0, 0, 0]  # decisions checked, with a request filling, with several

    def both(view: InstanceView) -> list[Request]:
        got = real(view)
        walked = real(
            InstanceView(
                instance_id=view.instance_id,
                waiting=view.waiting,
                running=view.running,
                swapped=view.swapped,
                kv=view.kv,
                cost_model=view.cost_model,
                predictor=view.predictor,
                limits=view.limits,
            )
        )
        assert view.filling is not None
        assert got == walked, (got, walked)
        calls[0] += 1
        calls[1] += bool(got)
        calls[2] += len(got) > 1
        return got

    monkeypatch.setattr(unified, "_filling", both)
    return calls


def _cfg(policy: str, params: dict[str, Any], kv_tokens: int | None) -> SimConfig:
    w = WorkloadSpec(mix="sharegpt", arrival=PoissonArrivals(rate=24.0), duration_s=15, seed=2)
    chunk = params.pop("chunk_size", None)
    return SimConfig(
        workload=w,
        instance=InstanceConfig(max_running=32, kv_capacity_tokens=kv_tokens, chunk_size=chunk),
        policy=policy,
        policy_params=params,
    )


@pytest.mark.parametrize(
    ("policy", "params", "kv_tokens", "cluster"),
    [
        ("sarathi", {}, None, {"replicas": [{"count": 2}], "router": "least-outstanding"}),
        # KV fills: recompute preemptions of requests part-way through their fill
        ("sarathi", {}, 5000, {"replicas": [{"count": 1}]}),
        ("sarathi", {"preemption_mode": "swap"}, 5000, {"replicas": [{"count": 1}]}),
        # several fill at once (P = 96: a fill's last chunk leaves room for the next),
        # ranked by deadline
        ("sarathi-p=c", {"order": "edf", "chunk_size": 96}, 5000, {"replicas": [{"count": 1}]}),
        # a failure hands every request back (evacuate), recovery takes requests again
        (
            "sarathi",
            {},
            6000,
            {
                "replicas": [{"count": 2}],
                "router": "round-robin",
                "failures": [{"replica": 0, "at_s": 5.0, "recover_s": 8.0}],
            },
        ),
        # prefilled requests arrive as decodes on the decode replica (add_prefilled)
        ("sarathi", {}, None, {"replicas": [{"role": "prefill"}, {"role": "decode"}]}),
    ],
)
def test_filling_superset_gives_what_a_walk_gives(
    policy: str,
    params: dict[str, Any],
    kv_tokens: int | None,
    cluster: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _checked_filling(monkeypatch)
    res = simulate_cluster(_cfg(policy, dict(params), kv_tokens), ClusterConfig.load(cluster))
    assert res.summary["finished"] > 100
    assert calls[0] > 500 and calls[1] > 30  # both cases were exercised
    if kv_tokens is not None and "failures" not in cluster:
        assert res.summary["preemptions"] > 0


def test_filling_rechecks_each_request_and_keeps_the_running_order() -> None:
    from sloserve.core.request import RequestStatus

    def req(rid: int, arrival: float, out: int, computed: int, inst: int = 0) -> Request:
        r = Request(rid, arrival, 100, 50)
        r.status, r.instance_id = RequestStatus.RUNNING, inst
        r.num_output_tokens, r.num_computed_tokens = out, computed
        return r

    fill_late = req(1, 3.0, 0, 40)
    fill_early = req(2, 1.0, 0, 0)
    refill = req(3, 2.0, 5, 60)  # preempted once, refilling prompt + 5 outputs
    decoding = req(4, 0.5, 3, 102)  # its fill is done: not returned
    elsewhere = req(5, 0.1, 0, 10, inst=1)  # moved to another replica
    left = req(6, 0.2, 0, 10)
    left.status = RequestStatus.PREEMPTED_RECOMPUTE
    superset = {r.req_id: r for r in (fill_late, decoding, elsewhere, fill_early, left, refill)}
    view = InstanceView(
        instance_id=0,
        waiting=[],
        running=[decoding, fill_early, refill, fill_late],
        swapped=[],
        kv=None,  # type: ignore[arg-type]
        cost_model=None,  # type: ignore[arg-type]
        predictor=make_predictor("oracle"),
        limits=Limits(64, 64, 1024, 8, 4),
        filling=superset.values(),
    )
    assert unified._filling(view) == [fill_early, refill, fill_late]
    view.filling = None  # no superset kept: every running request is walked
    assert unified._filling(view) == [fill_early, refill, fill_late]


def _chunking_instance(env: Environment, check_invariants: bool = False) -> Instance:
    """Sarathi prefilling 8 tokens a step: a 40-token prompt fills over five steps."""
    return Instance(
        env,
        make_policy("sarathi", {"prefill_tokens": 8}),
        small_linear_cost(),
        Limits(64, 8, 1024, 8, 4),
        make_predictor("oracle"),
        check_invariants=check_invariants,
    )


def test_debug_checks_catch_a_filling_request_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # An engine that forgot to note a request joining the running set is caught by the
    # invariant checks (check_invariants=True) at the next decision.
    monkeypatch.setattr(fills, "note_joined", lambda filling, r: None)
    env = Environment()
    inst = _chunking_instance(env, check_invariants=True)
    r = Request(0, 0.0, 40, 4)
    env.schedule(0.0, lambda: inst.add_request(r), PRIO_ARRIVAL)
    with pytest.raises(KVInvariantError, match="fill but are not in"):
        env.run()


@pytest.mark.parametrize(
    ("policy", "params", "kv_tokens"),
    [
        ("vllm", {}, None),
        ("vllm", {}, 5000),  # KV fills: preemptions, requests waiting on memory
        ("sarathi", {}, None),
        ("sarathi", {"preemption_mode": "swap"}, 5000),
        ("sarathi-nocp", {}, None),
        ("vllm-hy", {}, None),
        ("qlm", {}, 5000),  # replaces its config at its first decision (EDF order: off)
    ],
)
def test_all_decode_shortcut_answers_what_algorithm_1_answers(
    policy: str, params: dict[str, Any], kv_tokens: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = unified.UnifiedScheduler.schedule
    taken = [0, 0]

    def both(self: unified.UnifiedScheduler, view: InstanceView) -> Any:
        out = real(self, view)
        if self._all_decode_shortcut:
            self._all_decode_shortcut = False
            try:
                full = real(self, view)
            finally:
                self._all_decode_shortcut = True
            assert out == full
            taken[0] += 1
            taken[1] += out.repeatable and not view.waiting and not view.swapped
        return out

    monkeypatch.setattr(unified.UnifiedScheduler, "schedule", both)
    res = simulate_cluster(_cfg(policy, dict(params), kv_tokens), ClusterConfig())
    assert res.summary["finished"] > 100
    if policy == "qlm":  # EDF order: never taken, every decision through Algorithm 1
        assert taken[0] == 0
        return
    assert taken[0] > 500 and taken[1] > 10


def test_a_replaced_config_updates_the_shortcut() -> None:
    import dataclasses

    sched = make_policy("sarathi")
    assert isinstance(sched, unified.UnifiedScheduler) and sched._all_decode_shortcut
    sched.config = dataclasses.replace(sched.config, order="edf")
    assert not sched._all_decode_shortcut
    sched.config = dataclasses.replace(sched.config, order="fcfs", eviction_free=True)
    assert not sched._all_decode_shortcut


def test_the_all_decode_shortcut_follows_a_replaced_config() -> None:
    """A subclass may replace the config (QLM's agent does): switching chunked prefill on
    must reach the shortcut's fill test, so a request part-way through its prompt is not
    batched as a one-token decode (the review found it read the first config's value)."""
    import dataclasses

    from sloserve.core.request import RequestStatus
    from sloserve.engine.kv import PagedKVManager

    kv = PagedKVManager(100, 16)
    r = Request(req_id=1, arrival=0.0, num_prompt_tokens=1000, true_output_len=10)
    r.status, r.instance_id, r.num_computed_tokens = RequestStatus.RUNNING, 0, 512
    kv.allocate(1, 512)
    lim = Limits(
        max_batch_tokens=512, max_prefill_tokens=512, kv_capacity_tokens=1600,
        max_running=8, block_size=16,
    )  # fmt: skip
    view = InstanceView(
        instance_id=0, waiting=[], running=[r], swapped=[], kv=kv, cost_model=None,
        predictor=make_predictor("oracle"), limits=lim, filling=[r],
    )  # fmt: skip
    base = unified.UnifiedConfig("decode-first", hybrid=True, chunked_prefill=False)
    s = unified.UnifiedScheduler("x", base)
    s.config = dataclasses.replace(base, chunked_prefill=True)
    assert s.chunked_prefill
    out = s.schedule(view)
    assert [(e[0].req_id, e[1]) for e in out.batch] == [(1, 488)]
    assert not out.repeatable


@pytest.mark.parametrize("teardown", ["evacuate", "abort_all"])
def test_a_teardown_leaves_no_request_filling(teardown: str) -> None:
    """A replica that fails (evacuate) or aborts everything keeps no request in
    ``filling`` (a replica that never recovers held them to the end of the run)."""
    env = Environment()
    inst = _chunking_instance(env)
    r = Request(0, 0.0, 40, 4)
    env.schedule(0.0, lambda: inst.add_request(r), PRIO_ARRIVAL)
    env.run(until=0.0)  # the first 8-token chunk is scheduled: r is filling
    assert list(inst.filling) == [0]
    getattr(inst, teardown)()
    assert not inst.filling
