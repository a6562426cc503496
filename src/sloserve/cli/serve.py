"""CLI commands: serve (registered on import by ``sloserve.cli``)."""
