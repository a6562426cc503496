"""The run's collector setting (``experiments/gc_freeze.py``): what existed before is out
of the collector's passes during the run and back afterwards; cycles made during the run
are still freed; a simulation's result does not depend on it. ``paused``: the collector
off while a run is built, on while it runs (a ``frozen`` block inside), restored after."""

import gc
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

from sloserve.experiments.gc_freeze import frozen, paused


class _Node:
    def __init__(self) -> None:
        self.other: object = self


def test_frozen_during_the_block_and_unfrozen_after_even_on_error() -> None:
    gc.unfreeze()
    before = [_Node() for _ in range(10)]
    with frozen():
        assert gc.get_freeze_count() >= len(before)
    assert gc.get_freeze_count() == 0
    try:
        with frozen():
            raise RuntimeError("a run that fails")
    except RuntimeError:
        pass
    assert gc.get_freeze_count() == 0


def test_a_cycle_made_and_dropped_during_the_run_is_still_collected() -> None:
    with frozen():
        n = _Node()
        ref = weakref.ref(n)
        del n
        gc.collect()
        assert ref() is None


def test_a_simulation_gives_the_same_summary_with_and_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import contextlib

    import sloserve
    from sloserve.experiments import runner

    cfg = {"policy": "vllm", "workload": {"mix": "sharegpt", "num_requests": 200,
                                          "duration_s": None, "seed": 3}}  # fmt: skip
    a = sloserve.simulate(cfg).summary
    monkeypatch.setattr(runner, "frozen", contextlib.nullcontext)
    b = sloserve.simulate(cfg).summary
    for s in (a, b):
        s.pop("wall_seconds")
    assert a == b


def test_paused_turns_the_collector_off_and_back_on_even_on_error() -> None:
    assert gc.isenabled()
    with paused():
        assert not gc.isenabled()
        with frozen():  # the run itself: collected as usual
            assert gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError), paused():
        raise RuntimeError("a build that fails")
    assert gc.isenabled()


def test_paused_leaves_a_collector_the_caller_turned_off_alone() -> None:
    gc.disable()
    try:
        with paused():
            with frozen():
                assert not gc.isenabled()  # not ours to turn on
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_cycle_dropped_while_paused_is_freed_by_the_next_pass() -> None:
    with paused():
        n = _Node()
        ref = weakref.ref(n)
        del n
    gc.collect()
    assert ref() is None


def test_a_simulation_restores_the_collector() -> None:
    import sloserve

    cfg = {"policy": "vllm", "workload": {"mix": "sharegpt", "num_requests": 50,
                                          "duration_s": None, "seed": 3}}  # fmt: skip
    sloserve.simulate(cfg)
    assert gc.isenabled() and gc.get_freeze_count() == 0


@pytest.mark.parametrize("before", ["on", "off"])
def test_importing_the_cli_keeps_the_collectors_setting(before: str) -> None:
    """The CLI's import runs with the collector off and freezes what it built, only when
    the collector was on; either way it is as it was afterwards (a fresh process)."""
    code = (
        "import gc\n"
        f"{'gc.disable()' if before == 'off' else ''}\n"
        "import sloserve.cli\n"
        "print(gc.isenabled(), gc.get_freeze_count() > 10000)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == (["True", "True"] if before == "on" else ["False", "False"])


def test_a_command_starts_with_the_imports_freeze_released(tmp_path: Path) -> None:
    """The CLI's import freezes what it built, garbage cycles included (~500 objects);
    every command unfreezes it when it starts, so that a long-lived one (``serve``) does
    not keep that garbage for its life. A plugin (imported by the root callback, before
    the command) sees nothing frozen, and the import's garbage collectable."""
    plugin = tmp_path / "probe.py"
    plugin.write_text(
        "import gc, sys\n"
        "print('frozen', gc.get_freeze_count(), 'freed', gc.collect(), file=sys.stderr)\n"
    )
    res = subprocess.run(
        [sys.executable, "-m", "sloserve.cli", "--plugin", str(plugin), "policies"],
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(x for x in res.stderr.splitlines() if x.startswith("frozen "))
    _, frozen_n, _, freed = line.split()
    assert int(frozen_n) == 0
    assert int(freed) > 0  # the import's garbage, frozen (uncollectable) before


def test_release_import_unfreezes_only_what_freeze_import_froze() -> None:
    from sloserve.core import process_freeze as gc_freeze

    gc.unfreeze()
    gc.freeze()  # a caller's own freeze: not the import's, left alone
    try:
        n = gc.get_freeze_count()
        gc_freeze.release_import()
        assert gc.get_freeze_count() == n
        gc_freeze.freeze_import()
        gc_freeze.release_import()
        assert gc.get_freeze_count() == 0
        gc_freeze.freeze_import()
        with frozen():
            pass  # a run's end unfreezes everything, the import's freeze included
        gc.freeze()
        gc_freeze.release_import()  # nothing of the import's left: the caller's stays
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_the_cli_process_exits_without_walking_its_garbage(tmp_path: Path) -> None:
    """``main`` registers the exit freeze (``core/process_freeze.py``): a garbage cycle
    still there when the process ends is left to the operating system, not walked by the
    shutdown's collections. An exit hook registered before ``main`` runs after the
    freeze (hooks run last-registered first) and sees the cycle survive a collection."""
    code = (
        "import atexit, gc, sys, weakref\n"
        "import sloserve.cli\n"
        "class Node:\n"
        "    pass\n"
        "refs = []\n"
        "def probe():\n"
        "    gc.collect()\n"
        "    print('survived', refs[0]() is not None, file=sys.stderr)\n"
        "atexit.register(probe)\n"
        "gc.disable()  # the cycle must wait for the exit: no pass during the command\n"
        "n = Node()\n"
        "n.me = n\n"
        "refs.append(weakref.ref(n))\n"
        "del n\n"
        "sloserve.cli.main(['policies'])\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "survived True" in res.stderr.splitlines()


def test_interleaved_blocks_leave_the_collector_on() -> None:
    # A paused block ending while another thread's run (a frozen block) is still open:
    # the run's end must not turn the collector off for good (the review's repro).
    assert gc.isenabled()
    a, b = paused(), frozen()
    a.__enter__()
    assert not gc.isenabled()
    b.__enter__()
    assert gc.isenabled()
    a.__exit__(None, None, None)
    assert gc.isenabled()
    b.__exit__(None, None, None)
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_the_last_frozen_block_unfreezes() -> None:
    a, b = frozen(), frozen()
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    assert gc.get_freeze_count() > 0  # the other run still has its objects frozen
    b.__exit__(None, None, None)
    assert gc.get_freeze_count() == 0


def test_simulations_in_threads_leave_the_collector_on() -> None:
    from concurrent.futures import ThreadPoolExecutor

    import sloserve

    cfg = {"policy": "vllm", "workload": {"mix": "sharegpt", "num_requests": 40,
           "arrival": {"kind": "poisson", "rate": 20.0}}}  # fmt: skip
    assert gc.isenabled()
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda _i: sloserve.simulate(cfg).summary, range(12)))
    assert len(done) == 12
    assert gc.isenabled() and gc.get_freeze_count() == 0
