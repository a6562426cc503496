"""Aladdin §4.1: the all-reduce overhead of tensor parallelism, calibrated from Vidur's
network profiles.

Aladdin models the all-reduce cost of ``N_g`` GPUs as proportional to ``(N_g − 1)/N_g``
(a ring all-reduce moves ``2·(N_g − 1)/N_g`` of the message over each link). We fit
``t(size, N_g) = α + β·size·(N_g − 1)/N_g`` (seconds, bytes) by least squares to the
median times of ``network/<topology>/all_reduce.csv`` (Vidur's profiling, read from
``../shared/vidur-profiling`` relative to the repository, never copied in), keeping only
the rows where the workers sit in one node (``devices_per_node == num_workers``), as
Aladdin's workers do.

Choices (parameters of :func:`fit_all_reduce` and :meth:`AllReduceFit.scaled`):

- The A100 DGX table is the default calibration (it has 2, 4 and 8 intra-node workers).
- Another GPU or link scales β by the ratio of link rates (the calibrated A100 NVLink
  rate over the target's NVLink or PCIe rate); α (launch latency) is kept. Aladdin's A100
  testbed joins its GPUs over PCIe, its V100 testbed over NVLink.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sloserve.core.errors import ConfigError
from sloserve.core.hardware import GPUSpec

DEFAULT_TOPOLOGY = "a100_dgx"
CALIBRATION_LINK_GB_S = 300.0
"""NVLink GB/s per direction of the A100 the default table was measured on."""


@dataclass(frozen=True)
class AllReduceFit:
    """``t = alpha_s + beta_s_per_byte · size · (n − 1)/n`` for ``n`` GPUs in one node."""

    alpha_s: float
    beta_s_per_byte: float
    max_error: float
    """Largest relative error over the rows fitted (small messages are latency noise)."""
    source: str
    link_gb_s: float = CALIBRATION_LINK_GB_S

    def time(self, size_bytes: float, gpus: int) -> float:
        """Seconds of one all-reduce of ``size_bytes`` over ``gpus`` GPUs (0 for one)."""
        if gpus <= 1:
            return 0.0
        return self.alpha_s + self.beta_s_per_byte * size_bytes * (gpus - 1) / gpus

    def scaled(self, gpu: GPUSpec, link: str) -> AllReduceFit:
        """The fit moved to ``gpu`` over ``link`` (``nvlink`` or ``pcie``; module docstring)."""
        if link == "nvlink":
            if gpu.nvlink_gb_per_s is None:
                raise ConfigError(f"link: {gpu.name} has no NVLink; use pcie")
            rate = gpu.nvlink_gb_per_s
        elif link == "pcie":
            rate = gpu.pcie_gb_per_s
        else:
            raise ConfigError(f"link: {link!r} is not one of nvlink, pcie")
        return AllReduceFit(
            self.alpha_s,
            self.beta_s_per_byte * self.link_gb_s / rate,
            self.max_error,
            f"{self.source}, scaled to {gpu.name} {link} ({rate:g} GB/s)",
            rate,
        )


def fit_all_reduce(vidur_dir: str | Path, topology: str = DEFAULT_TOPOLOGY) -> AllReduceFit:
    """Fit α and β to ``<vidur_dir>/network/<topology>/all_reduce.csv`` (module docstring).

    Raises :class:`ConfigError` naming the file when it is missing or has no usable rows."""
    import pandas as pd

    path = Path(vidur_dir) / "network" / topology / "all_reduce.csv"
    if not path.is_file():
        raise ConfigError(f"vidur_dir: no all-reduce profile at {path}")
    df = pd.read_csv(path)
    rows = df[(df["devices_per_node"] == df["num_workers"]) & (df["num_workers"] > 1)]
    if len(rows) < 3:
        raise ConfigError(f"{path}: fewer than 3 intra-node all-reduce rows")
    n = rows["num_workers"].to_numpy(dtype=np.float64)
    x = rows["size"].to_numpy(dtype=np.float64) * (n - 1) / n
    y = rows["time_stats.all_reduce.median"].to_numpy(dtype=np.float64) / 1e3
    a = np.column_stack([np.ones_like(x), x])
    # Weighted by 1/y so large messages (where the link rate shows) and small ones (the
    # latency floor) both count, instead of the largest sizes dominating the residuals.
    w = 1.0 / np.maximum(y, 1e-9)
    (alpha, beta), *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
    alpha, beta = max(float(alpha), 0.0), max(float(beta), 0.0)
    pred = alpha + beta * x
    err = float(np.max(np.abs(pred - y) / y))
    return AllReduceFit(alpha, beta, err, f"vidur network/{topology}/all_reduce.csv")
