"""Fitting :class:`~sloserve.costmodel.linear.LinearCoefficients` to measured timings.

Two sources of measurements, one decomposition (non-attention floor+line, decode and prefill
attention, tensor-parallel all-reduce):

* Vidur's public GPU operator tables: :mod:`.vidur_tables` loads and fits each operator
  group, :mod:`.vidur_profiles` assembles the two original built-in profiles (the
  calibrated profiles of every model/GPU pair are :mod:`sloserve.costmodel.calibrate`'s).
* Whole measured iterations on your own hardware (``sloserve profile``): the CSV format
  (:mod:`.profile_csv`), its fit (:mod:`.profile_fit`) and the profile YAML it becomes
  (:mod:`.writer`).

:mod:`.lstsq` holds the relative least squares and error reports they share;
:mod:`.paper_forms` maps BROS' and Aladdin's cost formulas onto the same coefficients.
"""

from sloserve.costmodel.fit.paper_forms import aladdin_coefficients, bros_coefficients
from sloserve.costmodel.fit.profile_csv import (
    ProfileTable,
    read_profile_csv,
    validate_profile_frame,
)
from sloserve.costmodel.fit.profile_fit import (
    fit_profile_csv,
    fit_profile_frame,
    fit_profile_table,
    format_fit_report,
)
from sloserve.costmodel.fit.vidur_profiles import fit_builtin_profiles
from sloserve.costmodel.fit.writer import (
    hardware_from_metadata,
    profile_from_coefficients,
    profile_from_csv,
    render_profile_yaml,
    write_profile_yaml,
)

__all__ = [
    "ProfileTable",
    "aladdin_coefficients",
    "bros_coefficients",
    "fit_builtin_profiles",
    "fit_profile_csv",
    "fit_profile_frame",
    "fit_profile_table",
    "format_fit_report",
    "hardware_from_metadata",
    "profile_from_coefficients",
    "profile_from_csv",
    "read_profile_csv",
    "render_profile_yaml",
    "validate_profile_frame",
    "write_profile_yaml",
]
