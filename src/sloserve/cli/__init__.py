"""The ``sloserve`` command line.

``_app`` holds the typer app, the ``reproduce`` group, the options shared by several
commands and ``main``; each other module here adds one command family to it when imported
(``run``: simulate, compare, demo; ``sweep``; ``capacity``; ``workload``; ``costmodel``: the
costmodel group and profile; ``catalog``: policies, profiles; ``optimal``; ``serve``; the
papers' ``reproduce`` commands). Importing this package therefore registers every command,
whichever entry point is used (the ``sloserve`` console script, ``python -m sloserve.cli`` or
``typer.testing.CliRunner`` on ``app``).
"""

import gc

# Importing the command line builds ~45,000 objects that live as long as the process
# (modules, classes, pydantic schemas; numpy, typer). The cyclic collector's ~110 passes
# while they are built free nothing and cost ≈ 15 ms of a ≈ 0.28 s start, so it is off
# while they import, and what exists then is frozen (gc.freeze: left out of later passes,
# still freed by reference counting) rather than walked once more when it is back on.
# Every command unfreezes it when it starts (cli/_app.py's root callback): the import also
# leaves ~500 objects as garbage cycles, which the next full pass then frees (a simulation
# freezes what is alive when its run starts): core/process_freeze.py and
# experiments/gc_freeze.py. Left alone when the importing process has the collector off.
_collecting = gc.isenabled()
gc.disable()
try:
    # The order of these imports is the order of the commands in `sloserve --help`.
    # isort: off
    from sloserve.cli import (  # noqa: F401  (imported for their command registrations)
        run,
        sweep,
        capacity,
        workload,
        costmodel,
        execute,
        catalog,
        andes,
        bros,
        infermax,
        aladdin,
        qlm,
        reproduce_all,
        serve,
    )

    # isort: on
    from sloserve.cli._app import app, console, err_console, main, reproduce_app
finally:
    if _collecting:
        from sloserve.core.process_freeze import freeze_import

        freeze_import()
        gc.enable()

# Groups are listed in the order they are added: ``reproduce`` after workload and costmodel.
app.add_typer(reproduce_app, name="reproduce")

__all__ = ["app", "console", "err_console", "main"]
