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


CONST_STEP_S = 0.01
"""Every iteration of the ``const_profile`` fixture's replica, whatever it holds."""


@pytest.fixture(scope="module")
def const_profile(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Llama-2-7B on an A100 whose every iteration takes 10 ms (hand-computable runs)."""
    import yaml

    import sloserve

    src = Path(sloserve.__file__).parent / "costmodel" / "profiles" / "llama-2-7b-a100.yaml"
    data = yaml.safe_load(src.read_text())
    data.update(name="const-10ms", source="test", coefficients={"intercept": CONST_STEP_S})
    data.pop("fit_report", None)
    path = tmp_path_factory.mktemp("prof") / "const.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


# Tests that replace a function of a compiled module with monkeypatch (to count its calls
# or to plant a bug the engine must catch). In the compiled build (SLOSERVE_COMPILE=1,
# setup.py) compiled code calls the original directly, so there they would test nothing:
# they are skipped, and run in the pure-Python install CI uses.
PURE_PYTHON_ONLY = frozenset(
    {
        "test_chunk_run.py::test_pricing_the_final_chunk_as_a_middle_one_is_caught",
        "test_chunk_run.py::test_cluster_runs_are_the_same_with_final_chunk_runs",
        "test_decode_run.py::test_cluster_runs_are_the_same_with_promised_decode_runs",
        "test_continuation.py::test_the_continuation_holds_its_invariant_and_is_used",
        "test_continuation_adversarial.py::test_reordered_batches_give_the_results_without_the_continuation",
        "test_engine_state.py::test_debug_checks_catch_a_filling_request_left_out",
        "test_prefix_chunk_run.py::test_registering_at_the_chain_end_only_is_caught",
        "test_prefix_chunk_run.py::test_a_decode_still_registering_in_a_chain_is_caught",
        "test_prefix_chunk_run.py::test_a_cached_prompt_priced_from_token_zero_is_caught",
        "test_prefix_chunk_run.py::test_cluster_runs_with_prefix_caching_are_the_same_with_chunk_runs",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from sloserve.engine import compiled

    if not compiled():
        return
    skip = pytest.mark.skip(reason="monkeypatches a compiled module (pure-Python build only)")
    for item in items:
        name = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        if name in PURE_PYTHON_ONLY:
            item.add_marker(skip)
