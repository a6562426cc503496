"""Aladdin §3: the continuous-batching performance models, fitted by least squares.

Three linear models describe one worker (Aladdin, Nie et al., §3 and §6.2):

- KV usage of one request, Eq. 1: ``kv = h·(l_in + l_out) + j`` (GiB);
- prefill iteration time, Eq. 2: ``t_pre = k1·Σ l_in + c1`` (independent of batch size),
  never below the floor ``c0`` (choice, below);
- decode iteration time, Eq. 3: ``t_d = (k2·l_ave + c2)·b + c3 = k2·Σ ctx + c2·b + c3``,
  and from it, Eq. 4, the largest total context a batch of ``b`` may hold for the ATGT SLO
  ``T_dec``: ``l_d(b) = (T_dec − c3 − c2·b) / k2``.

Samples come from one of two places. :func:`samples_from_cost_model` prices a grid of
simulated batches with a replica's cost model (what the simulator will charge), and
:func:`samples_from_csv` reads measured traces. :func:`fit_models` fits all three with
``numpy.linalg.lstsq`` and reports each fit's largest relative error over its samples.

Choices where the paper is vague (each a parameter):

- KV is counted the way a paged engine allocates it: whole blocks of ``block_size`` tokens
  times the replica's KV bytes per token, in GiB. The fitted ``j`` is then about half a
  block; the error is reported over requests of at least ``kv_min_tokens`` (256) tokens,
  below which one block's rounding is a large fraction of a small number.
- The prefill grid splits each total evenly over batch sizes 1, 2, 4 and 8 (the paper's
  validation) with totals 16, 32, 64 and from 128 to ``max_prefill_tokens``; the decode
  grid crosses batch sizes 2..``max_batch`` with average contexts 64..4096 (Eq. 3 holds
  for ``b > 1``).
- Eq. 2 with a floor, ``t_pre = max(k1·Σ l_in + c1, c0)``: a prefill pass reads every
  weight once, so a short prompt costs about a decode step however few its tokens, and the
  time is flat up to the knee where compute takes over (in the simulator's cost model and
  on GPUs alike). A straight line fitted over 128..4096 tokens goes negative below about
  60 tokens (Llama-2-7B on the PCIe A100: ``c1`` = −4.4 ms) and charged ShareGPT's median
  prompt (149 tokens) 6.4 ms of the 10.8 ms the simulator takes, its first quartile (79)
  1.4 ms: constraint (d) then let prefills stall decodes far beyond the slack it checked.
  The paper's line has < 4 % error on its testbed (§6.2); ours is kept for the part above
  the knee and floored below it: ``c0`` is the fastest prefill sample, and the line is
  fitted to the samples slower than ``knee``·``c0`` (all of them when fewer than three
  are). Below the smallest sample the floor also keeps the line from extrapolating down.
  The knee is chosen from ``KNEES`` (1.05–1.5) by the fit's own largest relative error
  over all the prefill samples (ties: the smaller mean error, then the smaller knee), not
  fixed: where the cost rises gently before the knee (Llama-2-70B on two PCIe A100s: the
  all-reduces over PCIe add about 0.1 ms per prompt token to the 56.5 ms weight pass, so
  128 tokens take 68.6 ms) a fixed 1.25 left the 128-token samples under the line's
  start and charged them the floor, 10.5 % short (15.9 % at 116 tokens between grid
  points); the chosen 1.1 puts them on the line (largest error over the grid 8.3 %,
  14.3 % at 104 tokens, ShareGPT-weighted mean 4.1 % from 5.7 %). Llama-2-7B and 13B on
  one GPU, flat to the knee, fit the same for any candidate. A floor with a slope is not
  Eq. 2's form, so the 70B keeps about −14 % at 100 tokens.
- A measured-trace CSV has one row per sample: ``kind`` (``prefill``, ``decode`` or
  ``kv``), ``batch_size``, ``tokens`` (Σ l_in for prefill, Σ context for decode, l_in +
  l_out for kv) and ``value`` (seconds, or GiB for kv).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sloserve.core.errors import ConfigError
from sloserve.costmodel.base import BatchStats, CostModel

GIB = float(1 << 30)
KNEES = (1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.4, 1.5)
"""Candidate knees: Eq. 2's line is fitted to the prefill samples slower than
``knee × c0``, for the knee whose fit has the smallest largest relative error over all the
prefill samples (module docstring)."""

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class PerfSamples:
    """Observations to fit: one array per column, equal lengths within a kind."""

    prefill_batch: FloatArray
    prefill_tokens: FloatArray
    prefill_s: FloatArray
    decode_batch: FloatArray
    decode_context: FloatArray
    decode_s: FloatArray
    kv_tokens: FloatArray
    kv_gib: FloatArray
    source: str = ""


@dataclass(frozen=True)
class PerfModels:
    """The fitted coefficients of Eqs. 1–3 (seconds, GiB, tokens) and each fit's error."""

    h: float
    j: float
    k1: float
    c1: float
    k2: float
    c2: float
    c3: float
    c0: float = 0.0
    """Eq. 2's floor: the fewest seconds a prefill iteration takes (module docstring)."""
    knee: float = 0.0
    """Eq. 2's line was fitted to the prefill samples slower than ``knee·c0`` (0: given)."""
    max_error: dict[str, float] = field(default_factory=dict)
    """Largest relative error of each fit over its samples (``kv``, ``prefill``, ``decode``)."""
    mean_error: dict[str, float] = field(default_factory=dict)
    """Mean relative error of each fit over the same samples."""
    source: str = ""

    def kv_gib(self, tokens: float) -> float:
        """Eq. 1: the KV GiB of a request holding ``tokens`` context tokens."""
        return self.h * tokens + self.j

    def prefill_s(self, tokens: float) -> float:
        """Eq. 2: seconds of a prefill iteration over ``tokens`` prompt tokens in all, at
        least ``c0``."""
        return max(self.k1 * tokens + self.c1, self.c0) if tokens > 0 else 0.0

    def decode_s(self, batch: int, context_sum: float) -> float:
        """Eq. 3: seconds of a decode iteration of ``batch`` requests reading
        ``context_sum`` KV tokens in all."""
        return self.k2 * context_sum + self.c2 * batch + self.c3 if batch > 0 else 0.0

    def context_limit(self, batch: int, atgt_s: float) -> float:
        """Eq. 4: the largest total context ``l_d(b)`` a batch of ``batch`` may hold while
        each decode iteration stays within ``atgt_s``; negative when even an empty context
        misses it."""
        self.check_atgt(atgt_s)
        return (atgt_s - self.c3 - self.c2 * batch) / self.k2

    def max_batch(self, atgt_s: float, l_ave: float) -> int:
        """The largest batch whose average context ``l_ave`` meets ``atgt_s`` (B in Eq. 6)."""
        self.check_atgt(atgt_s)
        return max(0, math.floor((atgt_s - self.c3) / (self.k2 * l_ave + self.c2)))

    def check_atgt(self, atgt_s: float) -> None:
        """The paper's T_dec > c3: an SLO below a lone request's decode step is unmeetable."""
        if not atgt_s > self.c3:
            raise ConfigError(
                f"slo_atgt_ms: {atgt_s * 1e3:g} ms is not above the single-request decode "
                f"latency c3 = {self.c3 * 1e3:.3g} ms"
            )

    def report(self) -> dict[str, Any]:
        """The coefficients and errors as JSON-ready data."""
        return {
            "kv": {"h_gib_per_token": self.h, "j_gib": self.j},
            "prefill": {
                "k1_s_per_token": self.k1,
                "c1_s": self.c1,
                "c0_s": self.c0,
                "knee": self.knee,
            },
            "decode": {"k2_s_per_token": self.k2, "c2_s_per_seq": self.c2, "c3_s": self.c3},
            "max_error": dict(self.max_error),
            "mean_error": dict(self.mean_error),
            "source": self.source,
        }


def _lstsq(columns: list[FloatArray], y: FloatArray, what: str) -> FloatArray:
    if len(y) < len(columns):
        raise ConfigError(f"{what}: {len(y)} samples cannot fit {len(columns)} coefficients")
    a = np.column_stack(columns)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    return np.asarray(coef, dtype=np.float64)


def _rel(pred: FloatArray, y: FloatArray) -> FloatArray:
    return np.asarray(np.abs(pred - y) / np.maximum(np.abs(y), 1e-12), dtype=np.float64)


def _fit_prefill(tokens: FloatArray, seconds: FloatArray) -> tuple[float, float, float, float]:
    """Eq. 2 with its floor (module docstring): ``(k1, c1, c0, knee)``."""
    c0 = float(seconds.min()) if len(seconds) else 0.0
    best: tuple[tuple[float, float], float, float, float] | None = None
    for knee in KNEES:
        above = seconds > knee * c0
        few = above.sum() < 3
        pt = tokens if few else tokens[above]
        ps = seconds if few else seconds[above]
        # Relative residuals (weights 1/t): the error the paper reports, and the short
        # prompts ShareGPT is made of count as much as the long ones attention bends up.
        wt = 1.0 / np.maximum(ps, 1e-12)
        k1, c1 = _lstsq([pt * wt, wt], ps * wt, "prefill samples")
        rel = _rel(np.maximum(k1 * tokens + c1, c0), seconds)
        key = (float(rel.max()), float(rel.mean()))
        if best is None or key < best[0]:  # ties keep the smaller knee
            best = (key, float(k1), float(c1), knee)
        if few:  # every knee above this one fits the same samples
            break
    assert best is not None
    return best[1], best[2], c0, best[3]


def fit_models(samples: PerfSamples, *, kv_min_tokens: int = 256) -> PerfModels:
    """Least-squares fits of Eqs. 1–3 to ``samples`` with each fit's largest relative error.

    Raises :class:`ConfigError` when a kind has too few samples or a fitted slope that the
    paper's models need positive (k1, k2) is not."""
    s = samples
    ones = np.ones_like
    h, j = _lstsq([s.kv_tokens, ones(s.kv_tokens)], s.kv_gib, "kv samples")
    k1, c1, c0, knee = _fit_prefill(s.prefill_tokens, s.prefill_s)
    k2, c2, c3 = _lstsq(
        [s.decode_context, s.decode_batch, ones(s.decode_batch)], s.decode_s, "decode samples"
    )
    for name, v in (("k1", k1), ("k2", k2)):
        if not v > 0:
            raise ConfigError(f"{s.source or 'samples'}: fitted {name} = {v:.3g} is not positive")
    big = s.kv_tokens >= kv_min_tokens
    rel = {
        "kv": _rel(h * s.kv_tokens[big] + j, s.kv_gib[big]),
        "prefill": _rel(np.maximum(k1 * s.prefill_tokens + c1, c0), s.prefill_s),
        "decode": _rel(k2 * s.decode_context + c2 * s.decode_batch + c3, s.decode_s),
    }
    return PerfModels(
        h=float(h),
        j=float(j),
        k1=float(k1),
        c1=float(c1),
        k2=float(k2),
        c2=float(max(c2, 0.0)),
        c3=float(max(c3, 0.0)),
        c0=c0,
        knee=knee,
        max_error={k: float(v.max()) if len(v) else 0.0 for k, v in rel.items()},
        mean_error={k: float(v.mean()) if len(v) else 0.0 for k, v in rel.items()},
        source=s.source,
    )


def samples_from_cost_model(
    cost_model: CostModel,
    kv_bytes_per_token: int,
    *,
    block_size: int = 16,
    max_batch: int = 128,
    max_prefill_tokens: int = 4096,
    source: str = "",
) -> PerfSamples:
    """Price a grid of simulated batches with ``cost_model`` (module docstring)."""
    if kv_bytes_per_token <= 0 or block_size <= 0 or max_batch < 2 or max_prefill_tokens < 128:
        raise ConfigError(
            "perf samples: kv_bytes_per_token and block_size must be positive, max_batch >= 2 "
            "and max_prefill_tokens >= 128"
        )
    pb, pt, ps = [], [], []
    # The short totals show Eq. 2's floor (module docstring); ShareGPT's prompts are short.
    totals = np.concatenate([[16, 32, 64], np.linspace(128, max_prefill_tokens, 24)])
    for total in np.unique(totals.astype(int)):
        for b in (1, 2, 4, 8):
            each = int(total) // b
            if each < 16:
                continue
            st = BatchStats(
                num_prefill_tokens=each * b, num_prefill_seqs=b, prefill_attn_work=b * each * each
            )
            pb.append(b)
            pt.append(each * b)
            ps.append(cost_model.batch_time(st))
    db, dc, ds = [], [], []
    batches = np.unique(np.geomspace(2, max_batch, 12).astype(int))
    for b in batches:
        for l_ave in (64, 128, 256, 512, 1024, 2048, 4096):
            db.append(int(b))
            dc.append(int(b) * l_ave)
            ds.append(cost_model.decode_time(int(b), int(b) * l_ave))
    kt = np.arange(16, 4097, 7, dtype=np.float64)
    blocks = np.ceil(kt / block_size)
    kv = blocks * block_size * kv_bytes_per_token / GIB
    f = np.asarray
    return PerfSamples(
        f(pb, dtype=np.float64),
        f(pt, dtype=np.float64),
        f(ps, dtype=np.float64),
        f(db, dtype=np.float64),
        f(dc, dtype=np.float64),
        f(ds, dtype=np.float64),
        kt,
        kv,
        source=source or f"cost model {cost_model.name} (grid of simulated batches)",
    )


KINDS = ("prefill", "decode", "kv")


def samples_from_csv(path: str | Path) -> PerfSamples:
    """Measured samples from a CSV with columns ``kind,batch_size,tokens,value`` (module
    docstring). Raises :class:`ConfigError` naming the row and field of a bad value."""
    cols: dict[str, tuple[list[float], list[float], list[float]]] = {k: ([], [], []) for k in KINDS}
    p = Path(path)
    try:
        with p.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as e:
        raise ConfigError(f"samples: cannot read {p}: {e.strerror}") from None
    for i, row in enumerate(rows, start=2):
        kind = (row.get("kind") or "").strip()
        if kind not in cols:
            raise ConfigError(f"{p}:{i}: kind {kind!r} is not one of {', '.join(KINDS)}")
        vals = []
        for name in ("batch_size", "tokens", "value"):
            try:
                v = float(row.get(name) or "")
            except ValueError:
                raise ConfigError(f"{p}:{i}: {name} {row.get(name)!r} is not a number") from None
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"{p}:{i}: {name} {v} must be finite and >= 0")
            vals.append(v)
        for col, v in zip(cols[kind], vals, strict=True):
            col.append(v)
    f = np.asarray
    pr, de, kv = cols["prefill"], cols["decode"], cols["kv"]
    return PerfSamples(
        f(pr[0]),
        f(pr[1]),
        f(pr[2]),
        f(de[0]),
        f(de[1]),
        f(de[2]),
        f(kv[1]),
        f(kv[2]),
        source=f"measured samples {p.name}",
    )


def fit_profile(profile: str, *, samples_csv: str | Path | None = None) -> PerfModels:
    """The §3 models of a replica profile (built-in name, ``MODEL@GPU[xTP]`` or YAML):
    from its cost model's grid, or from measured samples when ``samples_csv`` is given."""
    from sloserve.costmodel.profile import load_profile

    if samples_csv is not None:
        return fit_models(samples_from_csv(samples_csv))
    p = load_profile(profile)
    return fit_models(
        samples_from_cost_model(
            p.cost_model(), p.kv_bytes_per_token, source=f"cost model of {p.name} (grid)"
        )
    )
