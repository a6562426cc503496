"""The command line's import freeze: what ``sloserve.cli``'s import built, frozen
(:func:`gc.freeze`) until a command starts.

Importing the command line builds tens of thousands of objects that live as long as the
process, with the cyclic collector off (``cli/__init__.py``); :func:`freeze_import` then
moves them out of the collector's passes so that they are not walked again when it is
back on, and :func:`release_import`, called where a command starts (the CLI's root
callback), unfreezes them: the few hundred objects the import left as garbage cycles are
then freed by the collector's next full pass instead of staying frozen for the process's
life (a ``sloserve serve`` runs no simulation, whose end unfroze them before). A run's own
freeze (``experiments/gc_freeze.frozen``) unfreezes everything when it ends and tells
this module (:func:`forget`).

Here rather than in ``experiments/gc_freeze.py`` because the CLI's import needs it before
anything of ``sloserve.experiments`` (whose package imports the runner, ≈ 60 ms) is
imported: a command other than a simulation never imports that.
"""

from __future__ import annotations

import gc

_frozen = False
"""Whether :func:`freeze_import` froze objects that are still frozen."""


def freeze_import() -> None:
    """Freeze every object alive now (the end of an import that built long-lived objects
    with the collector off); :func:`release_import` undoes it."""
    global _frozen
    gc.freeze()
    _frozen = True


def release_import() -> None:
    """Unfreeze what :func:`freeze_import` froze (nothing if it did not, or if everything
    was unfrozen since). The objects go to the oldest generation, where they would be by
    now had the collector run all along; the move itself walks nothing."""
    global _frozen
    if _frozen:
        _frozen = False
        gc.unfreeze()


def forget() -> None:
    """Everything was unfrozen by someone else (a run's end): nothing left to release, and
    a later :func:`release_import` must not unfreeze what others froze since."""
    global _frozen
    _frozen = False
