"""How every sloserve plot tells its series apart: the Okabe–Ito colour-blind-safe palette
with a line style per round of colours (so the 9th series is the 1st colour dashed, never a
second solid line of the same colour), and legend labels that say when a series is
identical to an earlier one (it would otherwise hide under it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

OKABE_ITO: tuple[str, ...] = (
    "#0072B2",  # blue
    "#E69F00",  # orange
    "#009E73",  # bluish green
    "#D55E00",  # vermillion
    "#CC79A7",  # reddish purple
    "#56B4E9",  # sky blue
    "#F0E442",  # yellow
    "#000000",  # black
)
LINE_STYLES: tuple[Any, ...] = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)))


def series_style(k: int) -> dict[str, Any]:
    """Colour and line style of the ``k``-th series: unique for the first 40."""
    n = len(OKABE_ITO)
    return {
        "color": OKABE_ITO[k % n],
        "linestyle": LINE_STYLES[(k // n) % len(LINE_STYLES)],
    }


def coincident_labels(series: Mapping[str, Sequence[float] | np.ndarray]) -> dict[str, str]:
    """Legend labels: a series equal (to 1e-9) to an earlier one is labelled
    ``"name (= earlier)"``."""
    labels: dict[str, str] = {}
    seen: list[tuple[str, np.ndarray]] = []
    for name, values in series.items():
        v = np.asarray(values, dtype=np.float64)
        same = next(
            (
                first
                for first, w in seen
                if w.shape == v.shape and v.size and np.allclose(w, v, rtol=0, atol=1e-9)
            ),
            None,
        )
        labels[name] = name if same is None else f"{name} (= {same})"
        if same is None:
            seen.append((name, v))
    return labels
