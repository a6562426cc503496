"""``python -m sloserve.cli``: the same entry point as the ``sloserve`` console script."""

from sloserve.cli import main

main()
