"""The search space of the capacity planner and the run config of one point in it.

An :class:`Arm` is everything but the replica count, the rate and the seed: a profile (a
model on a GPU kind at a TP degree; ``A+B`` is a heterogeneous mix of GPU kinds), a
router, a per-instance policy and a :class:`Layout` (aggregated, or disaggregated
prefill/decode at a ratio). The TP degree is part of the profile: list the same model at
several degrees (``llama-2-70b@a100-80gbx2,llama-2-70b@a100-80gbx4``) to search over it.

Choices (each a parameter):

* A mix ``A+B`` of *n* replicas gives profile *i* ``n // k`` replicas plus one for the
  first ``n % k`` (an even split, the first kind first). Disaggregated with a mix: prefill
  replicas on the first kind, decode replicas on the last.
* A ``pd:P:D`` layout with *n* replicas has ``max(1, round(n·P/(P+D)))`` prefill replicas
  and the rest decode (at least one each, so it needs n >= 2).
* **Rates** (:func:`with_rate`): an arrival process gets ``arrival.rate = rate`` (its shape —
  burstiness, diurnal swing, length mix — is kept: the process is time-scaled); a replayed
  trace is sped up by ``rate / native`` (``replay.speedup``), where ``native`` is the trace's
  own mean rate over the run's window, so the arrival pattern is the trace's, compressed or
  stretched in time. The realised rate of each run is reported beside the nominal one.
* The price of a GPU-hour of a profile is the profile's ``gpu_hour_usd`` unless
  ``prices`` names the profile.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sloserve.core.errors import ConfigError

MAX_REPLICAS = 256


@dataclass(frozen=True, order=True)
class Layout:
    """Aggregated serving (``prefill == decode == 0``) or disaggregated at ``P:D``."""

    prefill: int = 0
    decode: int = 0

    @property
    def disaggregated(self) -> bool:
        return self.prefill > 0

    @property
    def min_replicas(self) -> int:
        return 2 if self.disaggregated else 1

    def split(self, n: int) -> tuple[int, int]:
        """(prefill, decode) replicas of an ``n``-replica disaggregated cluster."""
        p = max(1, round(n * self.prefill / (self.prefill + self.decode)))
        p = min(p, n - 1)
        return p, n - p

    def __str__(self) -> str:
        return f"pd{self.prefill}:{self.decode}" if self.disaggregated else "agg"


def parse_layout(text: str, where: str = "--layouts") -> Layout:
    """``agg`` or ``pd:P:D`` (e.g. ``pd:1:2``: one prefill replica per two decode)."""
    t = text.strip()
    if t == "agg":
        return Layout()
    parts = t.split(":")
    if len(parts) == 3 and parts[0] == "pd" and parts[1].isdigit() and parts[2].isdigit():
        p, d = int(parts[1]), int(parts[2])
        if p >= 1 and d >= 1:
            return Layout(p, d)
    raise ConfigError(f"{where}: {text!r} is not 'agg' or 'pd:P:D' with P, D >= 1")


@dataclass(frozen=True, order=True)
class Arm:
    """One configuration of the space, but for the replica count, rate and seed."""

    profile: str
    router: str
    policy: str
    layout: Layout = field(default_factory=Layout)

    @property
    def profiles(self) -> tuple[str, ...]:
        return tuple(self.profile.split("+"))

    @property
    def label(self) -> str:
        return f"{self.profile} | {self.router} | {self.policy} | {self.layout}"


def arms(
    profiles: Sequence[str],
    routers: Sequence[str],
    policies: Sequence[str],
    layouts: Sequence[Layout] = (Layout(),),
) -> list[Arm]:
    """Every combination (an empty list of any of them: a ConfigError naming it)."""
    for name, vals in (
        ("--profiles", profiles),
        ("--routers", routers),
        ("--policies", policies),
        ("--layouts", layouts),
    ):
        if not vals:
            raise ConfigError(f"{name}: the search space is empty (give at least one)")
    return [
        Arm(p, r, pol, lay)
        for p in profiles
        for r in routers
        for pol in policies
        for lay in layouts
    ]


def groups(arm: Arm, n: int, prices: Mapping[str, float | None]) -> list[dict[str, Any]]:
    """The ``cluster.replicas`` groups of ``arm`` with ``n`` replicas."""
    profs = arm.profiles

    def group(profile: str, count: int, **extra: Any) -> dict[str, Any]:
        g: dict[str, Any] = {"count": count, "profile": profile, **extra}
        if prices.get(profile) is not None:
            g["gpu_hour_usd"] = prices[profile]
        return g

    if arm.layout.disaggregated:
        p, d = arm.layout.split(n)
        return [group(profs[0], p, role="prefill"), group(profs[-1], d, role="decode")]
    k = len(profs)
    counts = [n // k + (1 if i < n % k else 0) for i in range(k)]
    return [group(pr, c) for pr, c in zip(profs, counts, strict=True) if c > 0]


def uses_replay(workload: Mapping[str, Any]) -> bool:
    """Whether the workload replays a trace's arrival times (rates by speed-up)."""
    has_trace = workload.get("trace") is not None or workload.get("trace_format") == "sharegpt"
    return has_trace and workload.get("trace_use", "replay") == "replay"


def with_rate(base: Mapping[str, Any], rate: float, native: float | None) -> dict[str, Any]:
    """``base`` (a run config mapping) with its arrivals time-scaled to ``rate`` req/s."""
    data: dict[str, Any] = json.loads(json.dumps(base))
    wl = data.setdefault("workload", {})
    if uses_replay(wl):
        if native is None or native <= 0:
            raise ConfigError("workload: the trace has no arrivals in the run's window")
        replay = wl.setdefault("replay", {})
        replay["speedup"] = rate / native
    else:
        arrival = wl.setdefault("arrival", {"kind": "poisson"})
        arrival["rate"] = rate
    return data


def native_rate(base: Mapping[str, Any]) -> float | None:
    """A replayed trace's own mean rate over the run's window (None: not a replay)."""
    if not uses_replay(base.get("workload", {})):
        return None
    from sloserve.config import validate
    from sloserve.experiments.runner import SimConfig, workload_of

    data = json.loads(json.dumps(dict(base)))
    data.get("workload", {}).setdefault("replay", {})["speedup"] = 1.0
    cfg = validate(SimConfig, data, "workload")
    reqs = workload_of(cfg).requests
    if not reqs:
        return None
    span = cfg.workload.duration_s if "duration_s" in cfg.workload.model_fields_set else None
    if span is None:
        span = max(r.arrival for r in reqs) or 1.0
    return len(reqs) / float(span)


def check_rates(rates: Sequence[float], where: str = "--rates") -> tuple[float, ...]:
    if not rates:
        raise ConfigError(f"{where}: no rate given")
    for r in rates:
        if not 0 < r <= 1e6:
            raise ConfigError(f"{where}: rate {r:g} outside (0, 1e6]")
    return tuple(sorted(set(rates)))


def parse_rates(text: str, where: str = "--rates") -> tuple[float, ...]:
    """``2:20:2`` (start:stop:step, stop included) or a list ``2,4,8``."""
    t = text.strip()
    try:
        if ":" in t:
            parts = [float(x) for x in t.split(":")]
            if len(parts) not in (2, 3):
                raise ValueError
            lo, hi = parts[0], parts[1]
            step = parts[2] if len(parts) == 3 else 1.0
            if hi < lo:
                raise ConfigError(f"{where}: {text!r}: max {hi:g} < min {lo:g}")
            if step <= 0:
                raise ConfigError(f"{where}: {text!r}: step {step:g} must be > 0")
            n = int((hi - lo) / step + 1e-9) + 1
            if n > 1000:
                raise ConfigError(f"{where}: {text!r} gives {n} rates (at most 1000)")
            return check_rates([round(lo + i * step, 9) for i in range(n)], where)
        return check_rates([float(x) for x in t.split(",") if x.strip()], where)
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{where}: {text!r} is not MIN:MAX[:STEP] or a list R1,R2,...") from None


def load_point(data: Mapping[str, Any], source: str = "capacity") -> tuple[Any, Any]:
    """The validated (SimConfig, ClusterConfig) of a run config mapping with a ``cluster:``
    section (one-line ConfigError naming the field)."""
    from sloserve.cluster.config import ClusterConfig
    from sloserve.config import validate
    from sloserve.experiments.runner import SimConfig

    body = dict(data)
    cluster = body.pop("cluster", None) or {}
    cfg = validate(SimConfig, body, source)
    return cfg, ClusterConfig.load(cluster, f"{source}: cluster")
