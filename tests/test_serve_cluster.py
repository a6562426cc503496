"""One router contract for simulation and live serving: the gateway's backends use the
cluster layer's router objects, its views, its Hold, and (emulated) the Cluster itself."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve_helpers import MODEL, live_server
from sloserve.cluster import routing
from sloserve.cluster.cluster import Cluster
from sloserve.cluster.routing import Hold, Router, make_router
from sloserve.cluster.view import ClusterView, ReplicaStatus, RouteRequest
from sloserve.core.errors import ConfigError
from sloserve.core.request import Request
from sloserve.experiments.cluster_run import simulate_cluster
from sloserve.experiments.runner import InstanceConfig, SimConfig
from sloserve.serve.backend import GenerationRequest, ReplicaState, TokenChunk
from sloserve.serve.emulated import EmulatedBackend, EmulatedConfig
from sloserve.serve.replica_view import GatewayReplica, route_request
from sloserve.serve.upstream import OpenAIUpstreamBackend
from sloserve.serve.upstream_config import UpstreamConfig

CONST = InstanceConfig(profile="llama-2-7b@a100-80gb", cost_model="constant:0.01")


def greq(prompt: int = 10, max_tokens: int = 5, model: str = MODEL, **kw: Any) -> GenerationRequest:
    return GenerationRequest(
        request_id="cmpl-t", endpoint="completions", model=model,
        prompt_tokens=prompt, max_tokens=max_tokens, arrival=time.monotonic(), **kw,
    )  # fmt: skip


def emulated(**kw: Any) -> EmulatedBackend:
    kw.setdefault("instance", CONST)
    kw.setdefault("time_scale", 20.0)
    kw.setdefault("served_model_name", MODEL)
    return EmulatedBackend(EmulatedConfig(**kw))


async def collect(be: EmulatedBackend, req: GenerationRequest) -> list[TokenChunk]:
    return [c async for c in be.generate(req)]


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


# ----------------------------------------------------------------------------- one class
@pytest.mark.parametrize("name", ["round-robin", "least-loaded", "power-of-two", "slo-aware"])
def test_gateway_and_simulation_use_the_same_router_class(name: str) -> None:
    reqs = [Request(req_id=i, arrival=0.1 * i, num_prompt_tokens=20, true_output_len=5)
            for i in range(4)]  # fmt: skip
    sim = simulate_cluster(SimConfig(instance=CONST), cluster_of(name), reqs).cluster
    assert sim is not None
    emu = emulated(replicas=2, router=name)
    up = OpenAIUpstreamBackend(
        UpstreamConfig(upstreams=("http://127.0.0.1:9",), router=name, health_interval_s=0)
    )
    classes = {type(sim.router), type(emu.router), type(up.router), type(make_router(name))}
    assert len(classes) == 1
    (cls,) = classes
    assert issubclass(cls, Router) and cls.__module__ == "sloserve.cluster.routing"
    assert emu.router.name == up.router.name == sim.router.name == name

    async def main() -> None:  # the emulated backend routes through the Cluster itself
        await emu.start()
        assert isinstance(emu.cluster, Cluster) and emu.cluster.router is emu.router
        await emu.stop(0)

    run(main())


def cluster_of(router: str) -> Any:
    from sloserve.cluster.config import ClusterConfig, ReplicaGroup

    return ClusterConfig(replicas=[ReplicaGroup(count=2)], router=router)


def test_serve_routing_module_is_gone() -> None:
    with pytest.raises(ModuleNotFoundError):
        __import__("sloserve.serve.routing")


# ----------------------------------------------------------------------------- adapter views
def test_gateway_replica_view() -> None:
    st = ReplicaState("u", True, running=3, waiting=2, kv_usage=0.4, in_flight=7,
                      queued_prompt_tokens=50, predicted_ttft_s=0.3)  # fmt: skip
    v = GatewayReplica.of(4, st, model="m")
    assert (v.replica_id, v.name, v.model, v.status) == (4, "u", "m", ReplicaStatus.UP)
    assert v.outstanding == 7  # the gateway's fresh count is larger
    assert GatewayReplica.of(0, ReplicaState("u", True, 9, 4, 0.0, in_flight=2), model="m")\
        .outstanding == 13  # fmt: skip
    assert v.predicted_ttft_s(RouteRequest(1, "m", 10)) == 0.3
    down = GatewayReplica.of(0, ReplicaState("u", False, 0, 0, math.nan), model="m")
    assert down.status is ReplicaStatus.FAILED and down.predicted_ttft_s(route_request(greq()))\
        is None  # fmt: skip
    view = ClusterView([v, down])
    assert make_router("least-loaded").route(RouteRequest(1, "m", 10), view) == 4


class Spy(Router):
    """Records the views it is shown; picks the first UP one."""

    name = "spy"

    def __init__(self) -> None:
        self.seen: list[list[tuple[int, ReplicaStatus, int, float | None]]] = []

    def route(self, req: RouteRequest, view: ClusterView) -> int | Hold:
        reps = view.serving(req.model)
        self.seen.append(
            [(r.replica_id, r.status, r.outstanding, r.predicted_ttft_s(req)) for r in reps]
        )
        up = [r for r in reps if r.status is ReplicaStatus.UP]
        return up[0].replica_id if up else Hold("none_up")


def test_openai_backend_views_status_load_and_per_request_ttft() -> None:
    spy = Spy()
    b = OpenAIUpstreamBackend(
        UpstreamConfig(upstreams=("http://127.0.0.1:9", "http://127.0.0.1:10",
                                  "http://127.0.0.1:11"),
                       max_concurrency=2, health_interval_s=0, profile="llama-2-7b-a100"),
        router=spy,
    )  # fmt: skip
    b._ups[0].in_flight = 2  # full
    b._ups[1].health_ok = False  # unhealthy
    b._ups[2].in_flight = 1
    assert b._pick(greq(prompt=500)) == 2
    (seen,) = spy.seen
    assert [(i, s, o) for i, s, o, _t in seen] == [
        (0, ReplicaStatus.BUSY, 2), (1, ReplicaStatus.FAILED, 0), (2, ReplicaStatus.UP, 1),
    ]  # fmt: skip
    short = b._pick(greq(prompt=10))
    assert short == 2 and spy.seen[1][2][3] is not None and seen[2][3] is not None
    assert spy.seen[1][2][3] < seen[2][3]  # the request's own prefill is in the estimate


# ----------------------------------------------------------------------------- Hold -> queue
def test_openai_backend_queues_a_held_request() -> None:
    b = OpenAIUpstreamBackend(
        UpstreamConfig(
            upstreams=("http://127.0.0.1:9", "http://127.0.0.1:10"), max_concurrency=8,
            router="least-outstanding", router_params={"max_outstanding": 1},
            health_interval_s=0,
        )
    )  # fmt: skip

    async def main() -> None:
        first, second, third = greq(), greq(), greq()
        b._take(0, first)
        b._take(1, second)
        assert b._pick(third) is None and b.holds == {"max_outstanding": 1}
        waiter = asyncio.ensure_future(b._acquire(third, frozenset()))
        await asyncio.sleep(0.01)
        assert not waiter.done() and b.queue_size == 1  # held: queued, not dropped
        b._release(1, second, True)  # room at upstream 1: the router places it there
        assert await asyncio.wait_for(waiter, 2) == 1 and b.queue_size == 0

    run(main())


def test_emulated_backend_holds_in_the_cluster_queue_and_pulls() -> None:
    async def main() -> None:
        be = emulated(replicas=2, router="least-outstanding",
                      router_params={"max_outstanding": 1})  # fmt: skip
        await be.start()
        tasks = [asyncio.ensure_future(collect(be, greq(max_tokens=30))) for _ in range(4)]
        # Two run, two wait for room (pull). Polled, not a fixed sleep: on a loaded machine
        # the four submissions may take longer than any sleep we would pick (once flaky).
        for _ in range(5000):
            if be.cluster.submitted == 4:
                break
            await asyncio.sleep(0.001)
        assert be.cluster.submitted == 4 and be.queue_size == 2
        outs = await asyncio.gather(*tasks)
        assert [len(o) for o in outs] == [30] * 4
        assert be.cluster.holds["max_outstanding"] >= 2
        assert [len(i.done) for i in be.instances()] == [2, 2]
        await be.stop(0)

    run(main())


def test_disconnect_while_held_leaves_the_cluster_queue() -> None:
    async def main() -> None:
        be = emulated(router="least-outstanding", router_params={"max_outstanding": 1})
        await be.start()
        first = be.generate(greq(max_tokens=200))
        await first.__anext__()
        held = be.generate(greq(max_tokens=5))
        task = asyncio.ensure_future(held.__anext__())
        await asyncio.sleep(0.005)
        assert be.queue_size == 1
        task.cancel()  # the client gives up while its request is held
        with pytest.raises(asyncio.CancelledError):
            await task
        assert be.queue_size == 0
        assert Counter(r.status.name for r in be.cluster.ended.values()) == {"ABORTED": 1}
        await first.aclose()  # type: ignore[attr-defined]
        await be.stop(0)

    run(main())


# ----------------------------------------------------------------------------- the layer live
def test_a_scheduled_failure_fails_over_live_without_repeating_tokens() -> None:
    from sloserve.cluster.config import ClusterConfig, Failure, ReplicaGroup

    cluster = ClusterConfig(
        replicas=[ReplicaGroup(count=2)], router="round-robin",
        failures=[Failure(replica=0, at_s=2.0)],
    )  # fmt: skip

    async def main() -> None:
        be = emulated(cluster=cluster, time_scale=10.0)
        await be.start()
        out = await collect(be, greq(max_tokens=300))  # 3 s simulated, from replica 0
        assert [c.num_tokens for c in out] == [1] * 300  # no token twice, none lost
        assert out[-1].finish_reason == "length"
        reps = be.cluster.replicas
        assert reps[0].status is ReplicaStatus.FAILED and reps[0].failures == 1
        assert be.replicas()[0].healthy is False and be.replicas()[1].healthy
        (r,) = be.instances()[1].done
        assert r.num_failovers == 1
        await be.stop(0)

    run(main())


def test_replica_groups_serve_their_models() -> None:
    from sloserve.cluster.config import ClusterConfig, ReplicaGroup

    cluster = ClusterConfig(
        replicas=[ReplicaGroup(count=1, model="small"), ReplicaGroup(count=2, model="big")],
        router="least-loaded",
    )

    async def main() -> None:
        be = emulated(cluster=cluster)
        assert be.models() == ("small", "big")
        await be.start()
        await asyncio.gather(*(collect(be, greq(model="big")) for _ in range(4)))
        await collect(be, greq(model="small"))
        assert [len(i.done) for i in be.instances()] == [1, 2, 2]
        await be.stop(0)

    run(main())


def test_bad_router_params_and_conflicting_fields() -> None:
    with pytest.raises(ConfigError, match="max_outstandin"):
        emulated(router="least-outstanding", router_params={"max_outstandin": 1})
    from sloserve.cluster.config import ClusterConfig

    with pytest.raises(ValueError, match="set them in cluster"):
        EmulatedConfig(replicas=2, cluster=ClusterConfig())
    with pytest.raises(ValueError, match="unknown parameter"):
        UpstreamConfig(upstreams=("http://a:1",), router="round-robin", router_params={"x": 1})


# ----------------------------------------------------------------------------- end to end
def test_serve_three_replicas_least_outstanding_over_http() -> None:
    """``sloserve serve --replicas 3 --router least-outstanding`` (the CLI's own builder)
    on loopback: twelve concurrent streams spread four per replica."""
    from sloserve.cli.serve import _emulated_backend

    be = _emulated_backend(
        None, {"cost_model": "constant:0.01"}, "llama-2-7b", "a100-80gb", 3, None,
        "least-outstanding", 20.0, None, None, None, 0, None,
    )  # fmt: skip
    assert type(be.router) is type(make_router("least-outstanding"))
    assert be.cluster_config.num_replicas == 3
    with live_server(be) as srv:

        async def main() -> list[int]:
            async with httpx.AsyncClient(timeout=30) as c:
                body = {"model": MODEL, "prompt": "hi", "max_tokens": 40}

                async def one() -> int:
                    r = await c.post(f"{srv.base_url}/completions", json=body)
                    assert r.status_code == 200, r.text
                    return int(r.json()["usage"]["completion_tokens"])

                return list(await asyncio.gather(*(one() for _ in range(12))))

        assert asyncio.run(main()) == [40] * 12
        assert [len(i.done) for i in be.instances()] == [4, 4, 4]
        metrics = httpx.get(f"{srv.url}/metrics", timeout=10).text
        assert all(f'replica="replica-{i}"' in metrics for i in range(3))


PLUGIN = '''
import sloserve
from sloserve.cluster.routing import Hold, Router


class Last(Router):
    """The accepting replica with the highest id."""

    name = "test-last"

    def route(self, req, view):
        up = [r for r in view.serving(req.model) if r.status.value == "up"]
        return up[-1].replica_id if up else Hold("none")


sloserve.register_router("test-last", lambda seed: Last(), "the last accepting replica")
'''


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "last_router.py"
    path.write_text(PLUGIN)
    yield path
    routing._ROUTERS.pop("test-last", None)


def test_custom_router_via_plugin_in_the_gateway_and_the_simulation(plugin: Path) -> None:
    from typer.testing import CliRunner

    from sloserve.cli import app
    from sloserve.cli.plugins import load_plugin

    res = CliRunner().invoke(
        app, ["--plugin", str(plugin), "simulate", "--replicas", "3", "--router", "test-last",
              "--rate", "4", "--duration", "3", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    load_plugin(str(plugin))  # what --plugin does before `sloserve serve` runs
    be = emulated(replicas=3, router="test-last")
    assert type(be.router).__name__ == "Last"

    async def main() -> None:
        await be.start()
        await asyncio.gather(*(collect(be, greq()) for _ in range(3)))
        assert [len(i.done) for i in be.instances()] == [0, 0, 3]
        await be.stop(0)

    run(main())
    up = OpenAIUpstreamBackend(
        UpstreamConfig(upstreams=("http://127.0.0.1:9", "http://127.0.0.1:10"),
                       router="test-last", health_interval_s=0)
    )  # fmt: skip
    assert up._pick(greq()) == 1


def test_serve_config_cluster_section_and_flags(tmp_path: Path) -> None:
    """``sloserve serve --config`` reads the ``cluster:`` section as ``simulate`` does;
    ``--router`` overrides it; the gateway's default router is least-loaded."""
    from sloserve.cli.serve import _emulated_backend

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "cluster:\n  replicas:\n    - {count: 2, policy: sarathi}\n    - {count: 1, start_s: 5}\n"
        "  router: least-outstanding\n  router_params: {max_outstanding: 4}\n"
        "  failures: [{replica: 0, at_s: 10, recover_s: 20}]\n"
    )
    args = ("llama-2-7b", "a100-80gb", None, None)
    tail = (20.0, None, None, None, 0, None)
    be = _emulated_backend(cfg, {}, *args, None, *tail)
    c = be.cluster_config
    assert (c.num_replicas, c.router, c.router_params) == (3, "least-outstanding",
                                                           {"max_outstanding": 4})  # fmt: skip
    assert [s.policy for s in be.specs] == ["sarathi", "sarathi", "vllm"]
    assert be.models() == ("llama-2-7b",)
    assert _emulated_backend(cfg, {}, *args, "round-robin", *tail).router.name == "round-robin"
    plain = _emulated_backend(None, {}, *args, None, *tail)
    assert plain.router.name == "least-loaded" and plain.cluster_config.num_replicas == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster:\n  failures: [{replica: 3, at_s: 1}]\n")
    with pytest.raises(ConfigError, match=r"cluster.failures.0.replica: 3 out of range"):
        _emulated_backend(bad, {}, *args, None, *tail)
