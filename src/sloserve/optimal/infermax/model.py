"""The CP-SAT model of InferMax's optimal scheduling CSP (§3.3 of ``papers/infermax.txt``).

Given requests ``i`` (input I_i, output O_i, arrival T_i) and up to ``J`` batches ``j``,
the model chooses for every (i, j) the tokens ``c[i,j]`` request i processes in batch j and
whether it is evicted there (``e[i,j]``), and minimises total latency (or mean TTFT, mean
TPOT, makespan) priced by the linear cost model. The engine's own accounting is modelled
exactly, so that a solution replays through the engine with the same latencies
(:mod:`~sloserve.optimal.infermax.replay`).

Variables, in the paper's names (state "after batch j"; j = 0 is the initial state):

* ``c[i,j]`` tokens processed; ``cz[i,j]`` = c > 0 (request in the batch);
* ``m[i,j]`` KV tokens held during batch j (0 once finished; ``mz`` = m > 0);
* ``e[i,j]`` evicted (recompute) at the start of batch j;
* ``g[i,j]`` a token generated; ``G[i,j]`` = Σ_{j'≤j} g (tokens generated so far);
* the paper's input size ``I[i,j]`` is ``I_i + G[i,j]``: what a refill must recompute. The
  paper stores it separately and updates it on an eviction in the decode phase (its
  constraint (2)); here it is derived, which is the same quantity;
* ``d[i,j]``: the batch-j entry of request i is a decode. The paper's d is "all prompt
  tokens processed" (m ≥ I); the engine calls any 1-token step of a request that has
  generated tokens and has one token left a decode (including the last token of a chunked
  refill), and so does this model, so that batch costs match the engine;
* ``dg`` = d ∧ g (decode entries; they do not count against P), ``pf`` = cz ∧ ¬d (prefill
  entries), ``done[i,j]`` = G ≥ O_i.

Constraints: (1) termination Σ_j g = O_i; (2)+(3) memory management: m = 0 when evicted or
finished, else m[j] = m[j-1] + c[j] and m ≤ I_i + G[j-1] (no decode before the prompt is
done); g ⇔ m reaches I_i + G[j-1]; (4) c = 0 when evicted, c ≤ 1 in decode; (5) per batch
Σc ≤ C, Σc − Σdg ≤ P, Σm ≤ M, Σmz ≤ R_max. An eviction needs KV to drop, and happens in a
batch that runs something (the engine cannot run an empty iteration). Conditional
constraints use CP-SAT enforcement literals instead of the paper's Big-M rows (same
meaning; CP-SAT propagates them better).

Cost of batch j, in integer time units (``time_unit_s``, default 10 ps), coefficient by
coefficient from :class:`~sloserve.costmodel.linear.LinearCoefficients`:
``used·(intercept + comm_intercept) + max(floor, token_intercept + per_token·T) +
comm_per_token·T + decode_intercept·[any decode] + per_decode_seq·D + per_decode_kv·Σ ctx +
prefill_intercept·[any prefill] + per_prefill_seq·#prefills + per_prefill_work·Σ c·(c + m_prev)``,
with T = Σ c, D = #decodes, ctx = m_prev of each decode. The prefill attention work is
quadratic: ``c·(c + m_prev) = c·m`` for a prefill entry, one ``AddMultiplicationEquality``
per (i, j) — exact, not restricted. Each coefficient is rounded to the time unit, so the
objective differs from the engine's float cost by up to ~0.5 unit × what the coefficient
multiplies (tokens, KV read, attention work: measured ~1e-5 s, 4e-5 relative, at I = 1000
with the A100 profile); should that rounding make the solved schedule cost more (priced
in float) than the warm start, the warm start is returned (``stats["kept_warm_start"]``).
Results report both (``objective`` from the solver, ``latency`` from pricing the solved
schedule with the cost model itself). Batch start ``S_j = max(E_{j-1}, T_i of every request
in batch j)`` (online variant: nothing of i runs before it arrives, the GPU idles only while
it waits), end ``E_j = S_j + t_j`` (the paper's Acc_j).

Objectives: ``latency`` Σ_i (F_i − T_i), F_i the end of i's last batch (the default;
equivalently mean latency); ``ttft`` mean_i (first token − T_i); ``tpot`` Σ_i (F_i −
first)/(O_i − 1) over O_i > 1, as a mean (weights scaled to integers by their lcm);
``makespan`` E_J.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sloserve.core.errors import ConfigError
from sloserve.costmodel.linear import LinearCoefficients
from sloserve.engine.interface import Limits
from sloserve.optimal.infermax.options import CspOptions
from sloserve.optimal.infermax.schedule import Job


@dataclass
class _Built:
    c: dict[tuple[int, int], Any]
    e: dict[tuple[int, int], Any]
    m: dict[tuple[int, int], Any]
    G: dict[tuple[int, int], Any]
    used: list[Any]
    end: list[Any]
    objective: Any
    obj_scale: int
    """objective × time unit / obj_scale is the objective in seconds."""
    evictable: bool


def _build(
    model: Any,
    cp: Any,
    jobs: Sequence[Job],
    limits: Limits,
    coef: LinearCoefficients,
    J: int,
    opts: CspOptions,
    q: Any,
    t_min: float,
) -> _Built:
    N = len(jobs)
    C, P, M, R = (
        limits.max_batch_tokens,
        limits.max_prefill_tokens,
        limits.kv_capacity_tokens,
        limits.max_running,
    )
    # integer coefficients
    k_base = q(coef.intercept + coef.comm_intercept)
    k_floor = q(coef.token_floor)
    k_ti = q(coef.token_intercept)
    k_tok = q(coef.per_token)
    k_comm = q(coef.comm_per_token)
    k_dint, k_dseq, k_dkv = q(coef.decode_intercept), q(coef.per_decode_seq), q(coef.per_decode_kv)
    k_pint, k_pseq, k_pw = (
        q(coef.prefill_intercept),
        q(coef.per_prefill_seq),
        q(coef.per_prefill_work),
    )
    cap = [j.max_kv for j in jobs]
    # floored, minus the rounding of the (at most 4) coefficients a minimal batch pays
    t_min_u = max(0, math.floor(t_min * q(1.0)) - 4)  # q(1.0): units per second
    max_tokens = min(C, sum(cap))
    t_max = (
        k_base
        + max(k_floor, k_ti + k_tok * max_tokens)
        + k_comm * max_tokens
        + k_dint
        + k_dseq * N
        + k_dkv * M
        + k_pint
        + k_pseq * N
        + k_pw * max_tokens * M
    )
    horizon = q(max(j.arrival_s for j in jobs)) + J * t_max + 1

    c: dict[tuple[int, int], Any] = {}
    e: dict[tuple[int, int], Any] = {}
    m: dict[tuple[int, int], Any] = {}
    G: dict[tuple[int, int], Any] = {}
    done: dict[tuple[int, int], Any] = {}
    has: dict[tuple[int, int], Any] = {}  # G >= 1
    cz: dict[tuple[int, int], Any] = {}
    dg: dict[tuple[int, int], Any] = {}
    pf: dict[tuple[int, int], Any] = {}
    ctx: dict[tuple[int, int], Any] = {}
    work: dict[tuple[int, int], Any] = {}
    mz: dict[tuple[int, int], Any] = {}
    for i in range(N):
        # j = 0: the initial state
        m[i, 0] = 0
        G[i, 0] = 0
        done[i, 0] = False
        has[i, 0] = False
    false = model.NewConstant(0)
    true = model.NewConstant(1)

    def lit(x: Any) -> Any:
        if isinstance(x, bool):
            return true if x else false
        return x

    for jj in range(1, J + 1):
        for i, job in enumerate(jobs):
            I_i, O_i, k = job.input_tokens, job.output_tokens, cap[i]
            cmax = min(k, C)
            cv = model.NewIntVar(0, cmax, f"c_{i}_{jj}")
            ev = model.NewBoolVar(f"e_{i}_{jj}") if opts.allow_eviction else false
            mv = model.NewIntVar(0, k, f"m_{i}_{jj}")
            gv = model.NewBoolVar(f"g_{i}_{jj}")
            Gv = model.NewIntVar(0, min(O_i, jj), f"G_{i}_{jj}")
            dn = model.NewBoolVar(f"done_{i}_{jj}")
            hs = model.NewBoolVar(f"has_{i}_{jj}")
            czv = model.NewBoolVar(f"cz_{i}_{jj}")
            mzv = model.NewBoolVar(f"mz_{i}_{jj}")
            m_p, G_p, done_p, has_p = (
                m[i, jj - 1],
                G[i, jj - 1],
                lit(done[i, jj - 1]),
                lit(has[i, jj - 1]),
            )
            # cz <=> c > 0, mz <=> m > 0
            model.Add(cv >= 1).OnlyEnforceIf(czv)
            model.Add(cv == 0).OnlyEnforceIf(czv.Not())
            model.Add(mv >= 1).OnlyEnforceIf(mzv)
            model.Add(mv == 0).OnlyEnforceIf(mzv.Not())
            # finished requests hold nothing and do nothing
            model.Add(mv == 0).OnlyEnforceIf(done_p)
            model.Add(cv == 0).OnlyEnforceIf(done_p)
            # eviction: drops the KV (which must exist), runs nothing this batch
            if opts.allow_eviction:
                model.AddImplication(ev, done_p.Not())
                model.Add(cv == 0).OnlyEnforceIf(ev)
                model.Add(mv == 0).OnlyEnforceIf(ev)
                if isinstance(m_p, int):
                    model.Add(ev == 0)
                else:
                    model.Add(m_p >= 1).OnlyEnforceIf(ev)
            # (3) memory: m grows by c, never past the current input I_i + G (no decode
            # before the (re)fill is complete)
            model.Add(mv == m_p + cv).OnlyEnforceIf([ev.Not(), done_p.Not()])
            model.Add(mv <= I_i + G_p)
            # g <=> the (re)fill reaches I_i + G_{j-1}: a token is generated
            model.Add(mv >= I_i + G_p).OnlyEnforceIf(gv)
            model.Add(mv <= I_i + G_p - 1).OnlyEnforceIf(gv.Not())
            model.Add(Gv == G_p + gv)
            model.Add(Gv >= O_i).OnlyEnforceIf(dn)
            model.Add(O_i * dn <= Gv)  # the same, as a linear cut for the LP
            model.Add(Gv <= O_i - 1).OnlyEnforceIf(dn.Not())
            model.Add(Gv >= 1).OnlyEnforceIf(hs)
            model.Add(Gv == 0).OnlyEnforceIf(hs.Not())
            # d: a decode entry = in the batch, has generated, one token left before it
            near = model.NewBoolVar(f"near_{i}_{jj}")
            if isinstance(m_p, int):
                model.Add(near == 0)
            else:
                model.Add(m_p >= I_i + G_p - 1).OnlyEnforceIf(near)
                model.Add(m_p <= I_i + G_p - 2).OnlyEnforceIf(near.Not())
            dgv = model.NewBoolVar(f"dg_{i}_{jj}")
            model.AddBoolAnd([czv, has_p, near]).OnlyEnforceIf(dgv)
            model.AddBoolOr([czv.Not(), has_p.Not(), near.Not()]).OnlyEnforceIf(dgv.Not())
            pfv = model.NewBoolVar(f"pf_{i}_{jj}")
            model.Add(pfv + dgv == czv)
            if not opts.allow_chunked_prefill:
                model.AddImplication(pfv, gv)  # a prefill entry completes the (re)fill
            # decode attention reads m_prev KV tokens
            cx = model.NewIntVar(0, k, f"ctx_{i}_{jj}")
            if isinstance(m_p, int):
                model.Add(cx == 0)
            else:
                model.Add(cx == m_p).OnlyEnforceIf(dgv)
                model.Add(cx == 0).OnlyEnforceIf(dgv.Not())
            # prefill attention work c·(c + m_prev) = c·m for a prefill entry
            prod = model.NewIntVar(0, cmax * k, f"cm_{i}_{jj}")
            model.AddMultiplicationEquality(prod, [cv, mv])
            wv = model.NewIntVar(0, cmax * k, f"w_{i}_{jj}")
            model.Add(wv == prod).OnlyEnforceIf(pfv)
            model.Add(wv == 0).OnlyEnforceIf(pfv.Not())
            c[i, jj], e[i, jj], m[i, jj], G[i, jj] = cv, ev, mv, Gv
            done[i, jj], has[i, jj], cz[i, jj], dg[i, jj] = dn, hs, czv, dgv
            pf[i, jj], ctx[i, jj], work[i, jj], mz[i, jj] = pfv, cx, wv, mzv
        for i in range(N):
            model.Add(G[i, jj] >= G[i, jj - 1])  # implied; helps propagation

    if opts.min_evictions:
        model.Add(sum(e.values()) >= opts.min_evictions)

    # (1) termination
    for i, job in enumerate(jobs):
        model.Add(G[i, J] == job.output_tokens)

    used: list[Any] = []
    start: list[Any] = []
    end: list[Any] = []
    prev_end: Any = 0
    for jj in range(1, J + 1):
        rng = range(N)
        u = model.NewBoolVar(f"used_{jj}")
        model.AddMaxEquality(u, [cz[i, jj] for i in rng])
        used.append(u)
        if jj > 1:
            model.AddImplication(u, used[-2])  # empty batches only at the end
        if opts.allow_eviction:
            for i in rng:
                model.AddImplication(e[i, jj], u)
        T = sum(c[i, jj] for i in rng)
        D = sum(dg[i, jj] for i in rng)
        # (5) batch limits
        model.Add(T <= C)
        model.Add(T - D <= P)
        model.Add(sum(m[i, jj] for i in rng) <= M)
        if R < N:
            model.Add(sum(mz[i, jj] for i in rng) <= R)
        any_d = model.NewBoolVar(f"anyd_{jj}")
        model.AddMaxEquality(any_d, [dg[i, jj] for i in rng])
        any_p = model.NewBoolVar(f"anyp_{jj}")
        model.AddMaxEquality(any_p, [pf[i, jj] for i in rng])
        if not opts.allow_hybrid:
            model.Add(any_d + any_p <= 1)
        # batch time
        lin = model.NewIntVar(min(k_ti, 0), max(k_ti, 0) + k_tok * C, f"lin_{jj}")
        model.Add(lin == k_ti + k_tok * T)
        na_raw = model.NewIntVar(0, max(k_floor, k_ti + k_tok * C, 0), f"naraw_{jj}")
        model.AddMaxEquality(na_raw, [model.NewConstant(k_floor), lin])
        na = model.NewIntVar(0, max(k_floor, k_ti + k_tok * C, 0), f"na_{jj}")
        model.Add(na == na_raw).OnlyEnforceIf(u)
        model.Add(na == 0).OnlyEnforceIf(u.Not())
        dur = model.NewIntVar(0, t_max, f"t_{jj}")
        model.Add(
            dur
            == k_base * u
            + na
            + k_comm * T
            + k_dint * any_d
            + k_dseq * D
            + k_dkv * sum(ctx[i, jj] for i in rng)
            + k_pint * any_p
            + k_pseq * sum(pf[i, jj] for i in rng)
            + k_pw * sum(work[i, jj] for i in rng)
        )
        # S_j = max(E_{j-1}, arrival of every request in the batch); E_j = S_j + t_j
        s = model.NewIntVar(0, horizon, f"S_{jj}")
        arrivals = [q(job.arrival_s) for job in jobs]
        terms = [prev_end if not isinstance(prev_end, int) else model.NewConstant(prev_end)]
        for i in rng:
            if arrivals[i] > 0:
                a = model.NewIntVar(0, arrivals[i], f"arr_{i}_{jj}")
                model.Add(a == arrivals[i] * cz[i, jj])
                terms.append(a)
        if len(terms) == 1:
            model.Add(s == terms[0])
        else:
            model.AddMaxEquality(s, terms)
        # redundant linear cuts (the max and the enforced equalities are weak in the LP)
        model.Add(dur >= (k_base + k_floor) * u)
        model.Add(dur >= (k_base + k_ti) * u + (k_tok + k_comm) * T)
        model.Add(dur >= t_min_u * u)
        en = model.NewIntVar(0, horizon, f"E_{jj}")
        model.Add(en == s + dur)
        start.append(s)
        end.append(en)
        prev_end = en

    # finish and first-token times
    finish: list[Any] = []
    first: list[Any] = []
    for i, job in enumerate(jobs):
        F = model.NewIntVar(0, horizon, f"F_{i}")
        FT = model.NewIntVar(0, horizon, f"FT_{i}")
        for jj in range(1, J + 1):
            fin = model.NewBoolVar(f"fin_{i}_{jj}")
            prev_done = lit(done[i, jj - 1])
            model.AddBoolAnd([done[i, jj], prev_done.Not()]).OnlyEnforceIf(fin)
            model.AddBoolOr([done[i, jj].Not(), prev_done]).OnlyEnforceIf(fin.Not())
            model.Add(end[jj - 1] == F).OnlyEnforceIf(fin)
            fst = model.NewBoolVar(f"first_{i}_{jj}")
            prev_has = lit(has[i, jj - 1])
            model.AddBoolAnd([has[i, jj], prev_has.Not()]).OnlyEnforceIf(fst)
            model.AddBoolOr([has[i, jj].Not(), prev_has]).OnlyEnforceIf(fst.Not())
            model.Add(end[jj - 1] == FT).OnlyEnforceIf(fst)
        # cuts: every batch before i finishes takes at least t_min; each later token of i
        # needs its own batch
        model.Add(t_min_u * sum(1 - lit(done[i, jj - 1]) for jj in range(1, J + 1)) <= F)
        model.Add(FT + t_min_u * (job.output_tokens - 1) <= F)
        finish.append(F)
        first.append(FT)

    if opts.symmetry_breaking:
        # identical requests are interchangeable: order them by finish time
        for a in range(N):
            for b in range(a + 1, N):
                ja, jb = jobs[a], jobs[b]
                if (ja.input_tokens, ja.output_tokens, ja.arrival_s) == (
                    jb.input_tokens,
                    jb.output_tokens,
                    jb.arrival_s,
                ):
                    model.Add(finish[a] <= finish[b])
                    break  # chain to the next identical one only

    arrivals = [q(job.arrival_s) for job in jobs]
    scale = 1
    if opts.objective == "latency":
        objective = sum(finish) - sum(arrivals)
    elif opts.objective == "ttft":
        objective = sum(first) - sum(arrivals)
        scale = N  # mean TTFT
    elif opts.objective == "makespan":
        objective = end[-1]
    else:  # tpot: Σ (F − FT)/(O − 1), weights made integer by their lcm
        multi = [i for i, j in enumerate(jobs) if j.output_tokens > 1]
        if not multi:
            raise ConfigError("the TPOT objective needs a request with output > 1 token")
        scale = math.lcm(*(jobs[i].output_tokens - 1 for i in multi))
        if scale > 10**6:
            raise ConfigError("the TPOT objective's output lengths have too large an lcm")
        objective = sum(
            (scale // (jobs[i].output_tokens - 1)) * (finish[i] - first[i]) for i in multi
        )
        scale *= len(multi)  # so objective·unit/scale is the mean TPOT
    return _Built(c, e, m, G, used, end, objective, scale, opts.allow_eviction)
