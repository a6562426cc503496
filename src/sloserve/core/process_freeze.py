"""The command-line process's two freezes (:func:`gc.freeze`): what ``sloserve.cli``'s
import built, until a command starts; and everything, as the process exits.

**The import.** Importing the command line builds tens of thousands of objects that live
as long as the process, with the cyclic collector off (``cli/__init__.py``);
:func:`freeze_import` then moves them out of the collector's passes so that they are not
walked again when it is back on, and :func:`release_import`, called where a command
starts (the CLI's root callback), unfreezes them: the few hundred objects the import left
as garbage cycles are then freed by the collector's next full pass instead of staying
frozen for the process's life (a ``sloserve serve`` runs no simulation, whose end unfroze
them before). A run's own freeze (``experiments/gc_freeze.frozen``) unfreezes everything
when it ends and tells this module (:func:`forget`).

**The exit.** A finished simulation leaves its requests, instances and events as tens of
thousands of objects in reference cycles; the interpreter's shutdown runs full collections
(one before the modules are torn down, one after) that walk every object to free them,
≈ 90 ms of CPU after the 16,384-request runs of ``benchmarks/sim_e2e.py``, just before
the operating system takes all the memory back anyway. ``main`` registers
:func:`freeze_at_exit` with :mod:`atexit`: the exit hooks registered before it (the
standard library's, weakref finalizers) still run after it, standard streams are still
flushed and modules torn down, and what reference counting frees is still freed; only
objects in garbage cycles are left to the operating system, like any object the
interpreter does not collect at exit (Python does not promise to finalize those). The
command line's own files are closed where they are written (``with`` blocks).

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


def freeze_at_exit() -> None:
    """Freeze every object alive now: for the end of the process (registered with
    :mod:`atexit` by the CLI's ``main``), so that the shutdown's collections walk nothing
    the run left behind."""
    gc.freeze()
