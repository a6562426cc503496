"""The ``sloserve`` command line.

``_app`` holds the typer app, the options shared by several commands and the core commands;
each other module here adds one command family to it when imported. Importing this package
therefore registers every command, whichever entry point is used (the ``sloserve`` console
script, ``python -m sloserve.cli`` or ``typer.testing.CliRunner`` on ``app``).
"""

from sloserve.cli import (  # noqa: F401  (imported for their command registrations)
    andes,
    bros,
    infermax,
    serve,
)
from sloserve.cli._app import app, console, err_console, main

__all__ = ["app", "console", "err_console", "main"]
