"""What "meets the SLO" means for the capacity planner, and the early-stopping watch.

**Targets.** ``--slo ttft_p90=2s,tpot_p90=100ms`` is a list of :class:`Target`: a metric
(``ttft``, ``tpot``, ``e2e``, ``max_gap``), an optional percentile and a threshold. A
request *attains* the SLO when it finishes and every metric is within its threshold
(a one-token request has no TPOT: that target is met). Without ``--slo`` the workload's
own per-class SLOs decide (the ``slo_ok`` column: multi-class SLOs), and requests with no
SLO are left out.

**The verdict** of one run (:func:`verdict`): *attainment* is the share of the counted
requests that attain the SLO (rejected, aborted and unfinished requests are misses); a run
*passes* when its attainment is at least the target **and** each percentile target holds
(``ttft_p90=2s``: at least 90 % of the counted requests have TTFT <= 2 s, a request with no
first token counting as over). With an attainment target above a target's percentile the
percentile is implied; below it (``--attainment 0.8`` with ``p90``) it binds.

**Early stopping** (:class:`MissWatch`): a request whose miss is already certain (no first
token and waited longer than the TTFT threshold; a TTFT, TPOT or e2e bound already
exceeded; rejected or aborted) cannot be repaired by anything later in the run. Once the
certain misses exceed what the target allows over all the run's requests, the run cannot
pass and is stopped: the verdict is the same as the full run's, and the attainment it
reports is an upper bound.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sloserve.core.errors import ConfigError
from sloserve.core.request import Request, RequestStatus

METRICS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s", "max_gap": "max_gap_s"}
"""Target metric -> its request-table column."""

_ITEM = re.compile(r"^(?P<metric>[a-z_]+?)(?:_p(?P<pct>\d+(?:\.\d+)?))?$")
_VALUE = re.compile(r"^(?P<num>\d+(?:\.\d*)?|\.\d+)(?P<unit>ms|s)?$")


@dataclass(frozen=True)
class Target:
    """One SLO bound: ``metric`` (a key of :data:`METRICS`) at most ``threshold_s``; with a
    ``percentile``, also that share of requests must be within it."""

    metric: str
    threshold_s: float
    percentile: float | None = None

    @property
    def column(self) -> str:
        return METRICS[self.metric]

    def __str__(self) -> str:
        pct = "" if self.percentile is None else f"_p{self.percentile:g}"
        return f"{self.metric}{pct}={self.threshold_s:g}s"


def parse_slo(text: str, where: str = "--slo") -> tuple[Target, ...]:
    """``ttft_p90=2s,tpot_p90=100ms`` -> targets (one-line ConfigError naming the item)."""
    out: list[Target] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        m = _ITEM.match(key.strip())
        if not sep or m is None or m["metric"] not in METRICS:
            raise ConfigError(
                f"{where}: {item!r} is not METRIC[_pNN]=VALUE "
                f"(metrics: {', '.join(METRICS)}; e.g. ttft_p90=2s)"
            )
        v = _VALUE.match(value.strip())
        if v is None:
            raise ConfigError(f"{where}: {key.strip()}: {value!r} is not a duration (2s, 100ms)")
        seconds = float(v["num"]) / (1000.0 if v["unit"] == "ms" else 1.0)
        if not 0 < seconds < 1e6:
            raise ConfigError(f"{where}: {key.strip()}: {value!r} must be > 0")
        pct = None if m["pct"] is None else float(m["pct"])
        if pct is not None and not 0 < pct <= 100:
            raise ConfigError(f"{where}: {key.strip()}: percentile {pct:g} outside (0, 100]")
        if any(t.metric == m["metric"] for t in out):
            raise ConfigError(f"{where}: {m['metric']} is given twice")
        out.append(Target(m["metric"], seconds, pct))
    if not out:
        raise ConfigError(f"{where}: {text!r} names no target")
    return tuple(out)


def check_attainment(value: float, where: str = "--attainment") -> float:
    if not (isinstance(value, (int, float)) and 0 < value <= 1) or math.isnan(value):
        raise ConfigError(f"{where}: {value} is outside (0, 1]")
    return float(value)


@dataclass
class Verdict:
    """One run judged against the targets."""

    attainment: float
    passes: bool
    counted: int
    """Requests the SLO applies to."""
    shares: dict[str, float] = field(default_factory=dict)
    """Per target: the share of counted requests within its threshold."""


def _ok_columns(table: pd.DataFrame, targets: Sequence[Target]) -> dict[str, np.ndarray]:
    finished = (table["status"] == RequestStatus.FINISHED.name.lower()).to_numpy()
    out: dict[str, np.ndarray] = {}
    for t in targets:
        v = table[t.column].to_numpy(dtype=np.float64)
        within = v <= t.threshold_s
        if t.metric in ("tpot", "max_gap"):
            within |= np.isnan(v)  # a one-token request has no gap between tokens
        out[str(t)] = finished & within
    return out


def verdict(table: pd.DataFrame, targets: Sequence[Target], attainment: float) -> Verdict:
    """Judge a finished run's request table (see the module docstring)."""
    if targets:
        oks = _ok_columns(table, targets)
        n = len(table)
        joint = np.ones(n, dtype=bool)
        for ok in oks.values():
            joint &= ok
        shares = {k: float(ok.mean()) if n else 0.0 for k, ok in oks.items()}
    else:
        ok_col = table["slo_ok"].dropna() if len(table) else pd.Series([], dtype=bool)
        joint = ok_col.to_numpy(dtype=bool)
        n = len(joint)
        shares = {}
    att = float(joint.mean()) if n else 0.0
    passes = n > 0 and att >= attainment - 1e-12
    for t in targets:
        if t.percentile is not None and shares[str(t)] < t.percentile / 100 - 1e-12:
            passes = False
    return Verdict(att, passes, n, shares)


def _bounds(req: Request, targets: Sequence[Target]) -> dict[str, float]:
    """Per metric, the threshold that applies to ``req`` (the workload's SLO if none)."""
    if targets:
        return {t.metric: t.threshold_s for t in targets}
    s = req.slo
    out = {}
    if s.ttft_s is not None:
        out["ttft"] = s.ttft_s
    if s.tpot_s is not None:
        out["tpot"] = s.tpot_s
    if s.deadline_s is not None:
        out["e2e"] = s.deadline_s
    return out


def certain_misses(req: Request, now: float, bounds: dict[str, float]) -> set[str]:
    """The metrics ``req`` has already missed for certain at ``now`` (nothing later in the
    run can bring them back within their bounds)."""
    st = req.status
    if st in (RequestStatus.REJECTED, RequestStatus.ABORTED):
        return set(bounds) or {"any"}
    miss: set[str] = set()
    first = req.first_token_time
    ttft = bounds.get("ttft")
    if ttft is not None:
        waited = (first if first is not None else now) - req.arrival
        if waited > ttft * (1 + 1e-9):
            miss.add("ttft")
    e2e = bounds.get("e2e")
    if e2e is not None:
        end = req.finish_time if req.finish_time is not None else now
        if end - req.arrival > e2e * (1 + 1e-9):
            miss.add("e2e")
    tpot = bounds.get("tpot")
    if tpot is not None and first is not None and req.true_output_len > 1:
        # the last token comes at the finish, or after now: TPOT is at least this
        end = req.finish_time if req.finish_time is not None else now
        if (end - first) / (req.true_output_len - 1) > tpot * (1 + 1e-6):
            miss.add("tpot")
    return miss


class MissWatch:
    """Stops a run once it cannot reach the targets (see the module docstring); a
    :class:`~sloserve.experiments.cluster_run.RunWatch`."""

    def __init__(self, targets: Sequence[Target], attainment: float, every_s: float = 5.0) -> None:
        self.targets = tuple(targets)
        self.attainment = attainment
        self.every_s = every_s
        self._missed: dict[int, set[str]] = {}
        self._bounds: list[dict[str, float]] | None = None
        self._counted = 0
        self._done: set[int] = set()
        """Requests in a final state, already judged (not looked at again)."""

    def __call__(self, now: float, requests: Sequence[Request]) -> bool:
        if self._bounds is None:
            self._bounds = [_bounds(r, self.targets) for r in requests]
            self._counted = sum(1 for b in self._bounds if b)
        if not self._counted:
            return False
        for k, r in enumerate(requests):
            if r.arrival > now:
                break  # requests come in arrival order
            bounds = self._bounds[k]
            if not bounds or k in self._done:
                continue
            new = certain_misses(r, now, bounds)
            if new:
                known = self._missed.get(r.req_id)
                self._missed[r.req_id] = new if known is None else known | new
            if r.status in _FINAL:
                self._done.add(k)
        n = self._counted
        if len(self._missed) > (1 - self.attainment) * n + 1e-9:
            return True
        for t in self.targets:
            if t.percentile is None:
                continue
            over = sum(1 for m in self._missed.values() if t.metric in m or "any" in m)
            if over > (1 - t.percentile / 100) * n + 1e-9:
                return True
        return False

    @property
    def misses(self) -> int:
        """Requests whose miss is certain so far."""
        return len(self._missed)

    @property
    def counted(self) -> int:
        """Requests the SLO applies to (known after the first look)."""
        return self._counted


_FINAL = (RequestStatus.FINISHED, RequestStatus.REJECTED, RequestStatus.ABORTED)


def check_reachable(
    targets: Sequence[Target], profiles: Sequence[str], requests: Sequence[Request]
) -> None:
    """A ConfigError when a target is out of reach of every request on a profile: even
    the workload's easiest request, alone on an idle replica, takes longer (the error
    names the target, the profile and by how much)."""
    from sloserve.costmodel.profile import load_profile

    if not targets or not requests:
        return
    p_min = min(r.num_prompt_tokens for r in requests)
    multi = [r.true_output_len for r in requests if r.true_output_len > 1]
    o_min = min(r.true_output_len for r in requests)
    for name in dict.fromkeys(p for prof in profiles for p in prof.split("+")):
        cm = load_profile(name).cost_model()
        prefill = cm.prefill_time(p_min)
        decode = cm.decode_time(1, p_min + 1)
        best = {
            "ttft": prefill,
            "tpot": decode if multi else 0.0,
            "max_gap": decode if multi else 0.0,
            "e2e": prefill + (o_min - 1) * decode,
        }
        for t in targets:
            if best[t.metric] > t.threshold_s:
                raise ConfigError(
                    f"--slo: {t} cannot be met on {name}: even the easiest request alone "
                    f"takes {best[t.metric] * 1e3:.3g} ms ({best[t.metric] / t.threshold_s:.2g}× "
                    f"the target, {(best[t.metric] - t.threshold_s) * 1e3:.3g} ms over)"
                )
