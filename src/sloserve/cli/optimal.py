"""CLI commands: optimal (registered on import by ``sloserve.cli``)."""
