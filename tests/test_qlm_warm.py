"""QLM's warm start in bytes (``cluster/qlm/warm.py``): CPU memory capacity, the disk read
that makes a model warm, and the router parameters' validation."""

import pytest

from sloserve.cluster.qlm import make_qlm_router
from sloserve.cluster.qlm.warm import GIB, CPUMemory, catalog_weight_bytes
from sloserve.core.errors import ConfigError

SIZES = {"a": 10 * GIB, "b": 30 * GIB, "c": 5 * GIB}


def _mem(cap_gib: float, disk_gib_per_s: float = 1.0) -> CPUMemory:
    return CPUMemory(cap_gib * GIB, disk_gib_per_s * GIB)


def test_a_prefetch_is_warm_only_once_its_disk_read_has_ended() -> None:
    m = _mem(100)
    assert m.update(["a", "b"], "gpu", SIZES.__getitem__, 0.0) == set()
    # one read stream: a (10 s) then b (30 s more)
    assert m.update(["a", "b"], "gpu", SIZES.__getitem__, 9.9) == set()
    assert m.update(["a", "b"], "gpu", SIZES.__getitem__, 10.0) == {"a"}
    assert m.update(["a", "b"], "gpu", SIZES.__getitem__, 39.9) == {"a"}
    assert m.update(["a", "b"], "gpu", SIZES.__getitem__, 40.0) == {"a", "b"}
    assert m.bytes_read == 40 * GIB


def test_capacity_is_counted_in_bytes_in_queue_order() -> None:
    m = _mem(16)  # a (10) fits, b (30) does not, c (5) still fits after a
    m.update(["a", "b", "c"], "gpu", SIZES.__getitem__, 0.0)
    assert m.update(["a", "b", "c"], "gpu", SIZES.__getitem__, 100.0) == {"a", "c"}
    # the GPU's model is not held in CPU memory; a model no longer queued is dropped
    assert m.update(["c"], "a", SIZES.__getitem__, 101.0) == {"c"}


def test_a_model_leaving_the_gpu_stays_warm_when_still_queued() -> None:
    m = _mem(100)
    m.update(["b"], "a", SIZES.__getitem__, 0.0)
    assert m.update(["a"], "b", SIZES.__getitem__, 1.0) == {"a"}


def test_an_unwanted_read_not_started_is_cancelled() -> None:
    m = _mem(100)
    m.update(["b", "a"], "gpu", SIZES.__getitem__, 0.0)  # b 0–30 s, a 30–40 s
    m.update(["b"], "gpu", SIZES.__getitem__, 1.0)  # a no longer wanted: cancelled
    assert [r[0] for r in m.reads] == ["b"]
    assert m.update(["b"], "gpu", SIZES.__getitem__, 30.0) == {"b"}


def test_catalog_sizes_and_bad_parameters() -> None:
    assert catalog_weight_bytes("llama-2-70b") == pytest.approx(137.96e9, rel=1e-3)
    assert catalog_weight_bytes("no-such-model") is None
    with pytest.raises(ConfigError, match="cpu_mem_gib"):
        make_qlm_router("qlm", cpu_mem_gib=-1)
    with pytest.raises(ConfigError, match="disk_gb_per_s"):
        make_qlm_router("qlm", disk_gb_per_s=0)


def test_reads_into_cpu_memory_go_at_the_clusters_disk_rate_unless_the_router_sets_one() -> None:
    from sloserve.cluster.qlm.hooks import QLMHooks
    from sloserve.cluster.qlm.router import NOMINAL_PROFILE

    def hooks(disk: float | None) -> QLMHooks:
        return QLMHooks(
            lambda _i: None, lambda _r: NOMINAL_PROFILE, lambda _r, _m: 0.0,
            disk_gb_per_s=disk,
        )  # fmt: skip

    default = make_qlm_router("qlm")
    assert default._new_cpu_memory().disk_bytes_per_s == 2e9  # nothing bound yet
    default.bind(hooks(0.5))  # cluster.transfer.disk_gb_per_s: 0.5
    assert default._new_cpu_memory().disk_bytes_per_s == 0.5e9
    given = make_qlm_router("qlm", disk_gb_per_s=4.0)
    given.bind(hooks(0.5))  # router_params win
    assert given._new_cpu_memory().disk_bytes_per_s == 4e9
    unbound = make_qlm_router("qlm")
    unbound.bind(hooks(None))
    assert unbound._new_cpu_memory().disk_bytes_per_s == 2e9


def test_the_model_a_replica_is_changing_to_stays_wanted_after_its_groups_leave() -> None:
    """A committed change (draining, then a load) keeps reading its model into CPU memory
    although the groups that caused it were pulled elsewhere: the load is warm once the
    read has ended (measured on W_A: 6 of 16 loads were cold for this alone)."""
    from types import SimpleNamespace

    from sloserve.cluster.qlm.changes import warm_start
    from sloserve.cluster.qlm.hooks import QLMHooks
    from sloserve.cluster.qlm.router import NOMINAL_PROFILE
    from sloserve.cluster.view import ReplicaStatus

    warm: dict[int, set[str]] = {}
    qr = make_qlm_router("qlm", disk_gb_per_s=1.0)
    qr.bind(
        QLMHooks(
            lambda _i: None, lambda _r: NOMINAL_PROFILE, lambda _r, _m: 0.0,
            set_warm=warm.__setitem__, weight_bytes=lambda m: 10e9,
        )
    )  # fmt: skip
    qr.vq[0] = []  # its groups went to another replica ...
    qr._changing[0] = "b"  # ... after it was told to change to b (still draining)
    v = SimpleNamespace(model="a", status=ReplicaStatus.DRAINING, outstanding=3)

    def view(now: float) -> SimpleNamespace:
        return SimpleNamespace(now=now, replica=lambda _rid: v)

    assert warm_start(qr, view(0.0)) == [] and warm[0] == set()  # read 0–10 s
    warm_start(qr, view(10.0))
    assert warm[0] == {"b"}


def test_read_end_is_the_read_begun_by_now() -> None:
    m = _mem(100)
    m.update(["a", "b"], "gpu", SIZES.__getitem__, 0.0)  # a 0–10 s, b 10–40 s
    assert m.read_end("a", 4.0) == 10.0
    assert m.read_end("b", 4.0) is None  # queued behind a: not begun
    assert m.read_end("b", 10.0) == 40.0
    assert m.read_end("a", 12.0) == 10.0  # ended since the last update: nothing left
    assert m.read_end("c", 4.0) is None


def _loading(read_end: float | None, now: float = 5.0) -> tuple[float, str]:
    """begin_load on a stand-in cluster: cold 10 s (disk), warm 1 s (cpu); a controller
    whose read of "m" ends at ``read_end``. Returns (load seconds, tier)."""
    from types import SimpleNamespace

    from sloserve.cluster import lifecycle

    class Ctl:
        def read_ends_at(self, replica_id: int, model: str, now: float) -> float | None:
            assert (replica_id, model) == (0, "m")
            return read_end

    loader = SimpleNamespace(
        tier=lambda _m: "disk",
        respec=lambda spec, m: SimpleNamespace(model=m),
        load_time=lambda _spec, _m, tier: {"disk": 10.0, "cpu": 1.0}[tier],
    )
    clu = SimpleNamespace(
        loader=loader,
        controller=Ctl(),
        view=SimpleNamespace(moved=lambda *_a: None),
        env=SimpleNamespace(now=now, schedule=lambda *_a: None),
    )
    rep = SimpleNamespace(
        spec=SimpleNamespace(model="old"), warm_models=set(), replica_id=0, status=None,
        instance=None, pending_model=None, load_token=0, loads=[],
    )  # fmt: skip
    lifecycle.begin_load(clu, rep, "m")  # type: ignore[arg-type]
    start, end, model, tier = rep.loads[-1]
    assert (start, model) == (now, "m")
    return end - start, tier


def test_a_load_during_its_models_read_pays_only_the_rest_of_the_read() -> None:
    """The cluster's load hook (``lifecycle.ReadsIntoCPU``): a load that starts while the
    model's read into CPU memory is under way waits for the rest, then copies from CPU."""
    assert _loading(read_end=8.0) == (3.0 + 1.0, "read")  # 3 s of read left, 1 s copy
    assert _loading(read_end=4.0) == (1.0, "read")  # ended since QLM last looked
    assert _loading(read_end=None) == (10.0, "disk")  # no read begun: a cold load
    assert _loading(read_end=14.5) == (10.0, "disk")  # 9.5 + 1 s: the cold load is quicker


def test_the_qlm_router_reports_its_reads_to_the_cluster() -> None:
    from sloserve.cluster.lifecycle import ReadsIntoCPU

    qr = make_qlm_router("qlm", disk_gb_per_s=1.0)
    assert isinstance(qr, ReadsIntoCPU)
    assert qr.read_ends_at(0, "a", 0.0) is None  # no CPU memory yet
    qr.cpu_mem[0] = m = CPUMemory(100 * GIB, 1e9)
    m.update(["a"], "gpu", lambda _m: 10e9, 2.0)
    assert qr.read_ends_at(0, "a", 3.0) == 12.0
