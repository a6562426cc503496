import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


# Fixtures shared by several test modules (split from test_loaders.py and test_cli.py).
import pytest

from sloserve import cli
from sloserve.workloads.loaders import TraceTable, load_azure
from workload_helpers import AZURE


@pytest.fixture(scope="module")
def azure() -> TraceTable:
    if not AZURE.is_file():
        pytest.skip(f"the Azure LLM trace is not at {AZURE} (shared data, not in the repo)")
    return load_azure(AZURE)


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """A console wide enough that rich does not ellipsize table cells."""
    monkeypatch.setattr(cli.console, "_width", 250)
