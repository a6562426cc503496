"""Execute mode on CPU: the tokens of batched, paged, preempted execution equal a plain
per-request reference forward (no batching, no paging)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from sloserve.core.request import Request, RequestClass, RequestStatus  # noqa: E402
from sloserve.engine.execute import TorchExecutor, load_model  # noqa: E402
from sloserve.engine.execute.weights import LoadedModel  # noqa: E402
from sloserve.experiments.execute_run import simulate_execute  # noqa: E402
from sloserve.experiments.runner import InstanceConfig, SimConfig  # noqa: E402


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    torch.set_num_threads(1)
    return load_model(model_spec="tiny", device="cpu", seed=0)


def reference(loaded: LoadedModel, prompt: list[int], n_out: int) -> list[int]:
    """Greedy tokens by recomputing the whole sequence each step with plain attention."""
    m = loaded.model
    F = m.F
    spec = m.spec
    nq, nkv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    seq = list(prompt)
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(n_out):
            t = len(seq)
            x = F.embedding(torch.tensor(seq), m.embed)
            cos, sin = m.cos[:t], m.sin[:t]
            for lay in m.layers:
                h = m._rms(x, lay.w_in_norm)
                qkv = F.linear(h, lay.w_qkv)
                q = m._rope(qkv[:, : nq * d].view(t, nq, d), cos, sin).transpose(0, 1)
                k = m._rope(qkv[:, nq * d : (nq + nkv) * d].view(t, nkv, d), cos, sin)
                v = qkv[:, (nq + nkv) * d :].view(t, nkv, d)
                rep = nq // nkv
                k = k.transpose(0, 1).repeat_interleave(rep, 0)
                v = v.transpose(0, 1).repeat_interleave(rep, 0)
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + F.linear(o.transpose(0, 1).reshape(t, nq * d), lay.w_o)
                h = m._rms(x, lay.w_post_norm)
                gate, up = F.linear(h, lay.w_gate_up).chunk(2, dim=-1)
                x = x + F.linear(F.silu(gate) * up, lay.w_down)
            logits = F.linear(m._rms(x[-1:], m.final_norm), m.lm_head)
            tok = int(logits.argmax(-1))
            out.append(tok)
            seq.append(tok)
    return out


def _reqs(spec: list[tuple[int, int]], be: set[int] | None = None) -> list[Request]:
    return [
        Request(
            req_id=i,
            arrival=0.001 * i,
            num_prompt_tokens=p,
            true_output_len=o,
            req_class=RequestClass.BE if be and i in be else RequestClass.RT,
        )
        for i, (p, o) in enumerate(spec)
    ]


def _run(
    loaded: LoadedModel,
    policy: str,
    reqs: list[Request],
    kv_tokens: int,
    params: dict[str, Any] | None = None,
    **inst: Any,
) -> tuple[list[Request], TorchExecutor, dict[str, Any]]:
    cfg = SimConfig(
        instance=InstanceConfig(profile="llama-2-7b-a100", kv_capacity_tokens=kv_tokens, **inst),
        policy=policy,
        policy_params=params or {},
    )
    res, ex = simulate_execute(cfg, loaded, reqs, check_invariants=True)
    return res.requests, ex, res.summary


def _check_tokens(loaded: LoadedModel, reqs: list[Request], ex: TorchExecutor) -> None:
    for r in reqs:
        assert r.status is RequestStatus.FINISHED, r
        got = ex.tokens(r.req_id)
        assert len(got) == r.true_output_len
        want = reference(loaded, ex.prompt(r.req_id, r.num_prompt_tokens), len(got))
        assert got == want, f"request {r.req_id}"


SHAPES = [(23, 9), (5, 14), (40, 6), (17, 11), (9, 8), (31, 7)]


def test_vllm_batched_paged_tokens_match_reference(tiny: LoadedModel) -> None:
    reqs, ex, summary = _run(tiny, "vllm", _reqs(SHAPES), 4096)
    _check_tokens(tiny, reqs, ex)
    timing = summary["execute"]["timing"]
    assert timing["all"]["iterations"] == summary["iterations"]
    assert {"prefill", "decode"} <= set(timing)
    assert ex.cache is not None
    ex.cache.check_empty()
    assert not ex.cache.seqs


def test_sarathi_chunked_prefill_matches_reference(tiny: LoadedModel) -> None:
    reqs, ex, summary = _run(
        tiny, "sarathi", _reqs(SHAPES), 4096, chunk_size=8, max_batch_tokens=16
    )
    _check_tokens(tiny, reqs, ex)
    assert "hybrid" in summary["execute"]["timing"]


def test_recompute_preemption_matches_reference(tiny: LoadedModel) -> None:
    # 96 KV tokens for ~150 needed: vLLM evicts (recompute) and refills.
    reqs, ex, summary = _run(tiny, "vllm", _reqs(SHAPES), 96, block_size=4)
    assert summary["preemptions"] > 0 if "preemptions" in summary else True
    assert sum(r.num_preemptions for r in reqs) > 0
    _check_tokens(tiny, reqs, ex)


def test_swap_preemption_matches_reference(tiny: LoadedModel) -> None:
    reqs, ex, _ = _run(tiny, "vllm", _reqs(SHAPES), 96, {"preemption_mode": "swap"}, block_size=4)
    assert sum(r.num_swaps for r in reqs) > 0
    assert ex.cache is not None and ex.cache.transferred_tokens > 0
    _check_tokens(tiny, reqs, ex)


def test_bros_bidirectional_overwrite_and_restore_match_reference(tiny: LoadedModel) -> None:
    # RT and BE requests share blocks; with little KV, RT growth overwrites BE slots
    # (lazy checkpoint) and the BE request gets them back before it runs again.
    shapes = [(9, 12), (6, 20), (11, 10), (7, 18), (5, 16), (8, 12)]
    reqs, ex, _ = _run(tiny, "bros", _reqs(shapes, be={1, 3, 5}), 64, block_size=8)
    assert ex.cache is not None and ex.cache.transferred_tokens > 0
    _check_tokens(tiny, reqs, ex)


def test_andes_runs_real_tokens(tiny: LoadedModel) -> None:
    reqs, ex, _ = _run(tiny, "andes", _reqs(SHAPES), 128, block_size=4)
    _check_tokens(tiny, reqs, ex)


def test_abort_frees_kv_and_device_slots(tiny: LoadedModel) -> None:
    from sloserve.costmodel.profile import load_profile
    from sloserve.engine.env import Environment
    from sloserve.experiments.runner import build_instance

    cfg = SimConfig(instance=InstanceConfig(kv_capacity_tokens=256, block_size=4, multi_step=False))
    ex = TorchExecutor(tiny, load_profile("llama-2-7b-a100").cost_model())
    env = Environment()
    inst = build_instance(cfg, env, executor=ex)
    reqs = [
        Request(req_id=0, arrival=0.0, num_prompt_tokens=12, true_output_len=50),
        Request(req_id=1, arrival=0.0, num_prompt_tokens=8, true_output_len=3),
    ]
    for r in reqs:
        inst.add_request(r)
    for _ in range(6):
        env.step()
    assert reqs[1].status is RequestStatus.FINISHED
    assert inst.abort(reqs[0])
    env.run()
    assert reqs[0].status is RequestStatus.ABORTED
    assert inst.kv.num_used_blocks == 0
    assert ex.cache is not None
    ex.cache.sync(inst.kv, {})  # the next iteration's sync drops what ended
    ex.cache.check_empty()
    assert not ex.cache.seqs
