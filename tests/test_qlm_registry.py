"""QLM's package registers its routers without importing the other lazily registered
packages (asking ``router_names()`` imported Aladdin's too), and registers nothing twice
when imported again."""

import importlib
import os
import subprocess
import sys


def test_making_a_qlm_router_imports_no_aladdin_module() -> None:
    code = (
        "import sys\n"
        "from sloserve.cluster.routing import make_router\n"
        "make_router('edf')\n"
        "print(sorted(m for m in sys.modules if 'aladdin' in m))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env=os.environ.copy(),
    )  # fmt: skip
    assert out.stdout.strip() == "[]"


def test_qlm_package_imported_again_keeps_its_routers() -> None:
    import sloserve.cluster.qlm as qlm
    from sloserve.cluster.routing import router_names

    before = router_names()
    importlib.reload(qlm)
    assert router_names() == before
    assert {"qlm", "edf", "fcfs", "fcfs-swap", "edf-swap", "static-batch"} <= set(before)
