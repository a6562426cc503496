"""Calibrated profiles for every model/GPU pair in Vidur's profiling data, and the roofline
model's validation against all of Vidur's measurements.

The data are the Vidur project's public operator timings (microsoft/vidur, MIT licence),
read from ``shared/vidur-profiling`` (never copied into the repository);
``scripts/fit_vidur_profiles.py`` runs :func:`calibrate_all` and writes one YAML profile per
pair into ``costmodel/profiles/``. The fitting itself is :mod:`sloserve.costmodel.fit`'s
(relative least squares, every 5th point held out); this package decides what to fit for
which pair.

Parts: Vidur's model/GPU pairs, the TP choice and the table loaders (:mod:`.pairs`); the
attention calibration read as roofline efficiencies (:mod:`.attention`); one calibrated
profile per pair (:mod:`.profiles`); the roofline's validation against every measurement
(:mod:`.validation`). Each module's docstring says the choices made in it.
"""

from sloserve.costmodel.calibrate.attention import AttentionCalibration, calibrate_attention
from sloserve.costmodel.calibrate.pairs import VidurPair, choose_tp, vidur_pairs
from sloserve.costmodel.calibrate.profiles import calibrate_all, calibrate_pair
from sloserve.costmodel.calibrate.validation import (
    GROUPS,
    ValidationRow,
    format_table,
    group_summary,
    validate_roofline,
)

__all__ = [
    "GROUPS",
    "AttentionCalibration",
    "ValidationRow",
    "VidurPair",
    "calibrate_all",
    "calibrate_attention",
    "calibrate_pair",
    "choose_tp",
    "format_table",
    "group_summary",
    "validate_roofline",
    "vidur_pairs",
]
