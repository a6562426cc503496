"""Whether a router is QLM's, without importing QLM's package (start-up time).

QLM's routers (``qlm``, ``edf``, ``fcfs``, ...) plan the cluster: the cluster run makes
such a router its controller and adds its plan statistics to the summary. Its package
(``sloserve.cluster.qlm``) is imported only when one of its router names is asked for
(``cluster/routing.py``'s lazy registry): if it is not imported, no router can be one.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TypeGuard

if TYPE_CHECKING:
    from sloserve.cluster.qlm import QLMRouter


def is_qlm(router: object) -> TypeGuard[QLMRouter]:
    """Whether ``router`` is a :class:`~sloserve.cluster.qlm.QLMRouter` (module docstring)."""
    qlm = sys.modules.get("sloserve.cluster.qlm")
    return qlm is not None and isinstance(router, qlm.QLMRouter)
