"""CLI commands: reproduce_infermax (registered on import by ``sloserve.cli``)."""
