"""CLI commands: reproduce_bros (registered on import by ``sloserve.cli``)."""
