"""The Gateway API Inference Extension's headers: named objectives (priority, SLOs,
sheddable), fairness ids (round-robin between tenants in the gateway queue)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli_helpers import assert_user_error, run_main
from serve_helpers import (  # noqa: F401  (engines, fakes: fixtures)
    MODEL,
    _serve,
    emulated,
    engines,
    fakes,
    grant_order,
    greq,
    live_server,
    offline_backend,
)
from sloserve.core.errors import ConfigError
from sloserve.serve.api import GatewaySettings, create_app
from sloserve.serve.backend import GenerationRequest, ServeError, TokenChunk
from sloserve.serve.emulated import EmulatedBackend
from sloserve.serve.objectives import Objective, load_objectives
from sloserve.serve.upstream import OpenAIUpstreamBackend
from sloserve.serve.upstream_config import UpstreamConfig

OBJECTIVES = {
    "chat": Objective(priority=10, ttft_ms=300, tpot_ms=50),
    "batch": Objective(priority=-1),
}


class Recording(EmulatedBackend):
    """Keeps every request the API hands over."""

    seen: list[GenerationRequest]

    def generate(self, req: GenerationRequest) -> AsyncIterator[TokenChunk]:
        self.seen.append(req)
        return super().generate(req)


def _post(server: Any, headers: dict[str, str], **body: Any) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/completions", headers=headers, timeout=30,
        json={"model": MODEL, "prompt": "hi", "max_tokens": 2, **body},
    )  # fmt: skip


def test_objective_and_fairness_headers_reach_the_backend() -> None:
    be = emulated(Recording)
    be.seen = []
    obj, fair = "x-gateway-inference-objective", "x-gateway-inference-fairness-id"
    with live_server(be, GatewaySettings(objectives=OBJECTIVES)) as server:
        assert _post(server, {obj: "chat", fair: "tenant-a"}).status_code == 200
        assert _post(server, {obj: "batch"}).status_code == 200
        # x-slo-* headers and the body's priority are more specific than the objective
        r = _post(server, {obj: "chat", "x-slo-ttft-ms": "900"}, priority=3)
        assert r.status_code == 200
        assert _post(server, {}).status_code == 200
        bad = _post(server, {obj: "gold"})
        bad_fair = _post(server, {fair: "has space"})
    chat, batch, over, plain = be.seen
    assert (chat.priority, chat.sheddable, chat.fairness_id) == (-10, False, "tenant-a")
    assert (chat.slo.ttft_s, chat.slo.tpot_s) == (pytest.approx(0.3), pytest.approx(0.05))
    assert (batch.priority, batch.sheddable, batch.fairness_id) == (1, True, None)
    assert (over.priority, over.slo.ttft_s, over.slo.tpot_s) == (3, 0.9, pytest.approx(0.05))
    assert (plain.priority, plain.sheddable, plain.slo.ttft_s) == (0, False, 0.4)  # bros rt
    assert bad.status_code == 400
    err = bad.json()["error"]
    assert "unknown inference objective gold" in err["message"]
    assert "known: batch, chat" in err["message"]
    assert (err["param"], err["code"]) == (obj, "unknown_objective")
    assert bad_fair.status_code == 400 and bad_fair.json()["error"]["param"] == fair


def test_unknown_objective_without_configured_objectives_says_how_to_add_them() -> None:
    with live_server() as server:
        r = _post(server, {"x-gateway-inference-objective": "chat"})
    assert r.status_code == 400
    assert "--objectives" in r.json()["error"]["message"]


def test_round_robin_between_tenants() -> None:
    now = time.monotonic()

    def req(k: int, tenant: str | None, prio: int = 0) -> GenerationRequest:
        r = greq(arrival=now + k * 1e-3, priority=prio)
        r.fairness_id = tenant
        return r

    # tenant a queued four before b's two: b is not starved behind a
    reqs = [req(0, "a"), req(1, "a"), req(2, "a"), req(3, "a"), req(4, "b"), req(5, "b")]
    assert grant_order(offline_backend(order="fcfs"), reqs) == [0, 4, 1, 5, 2, 3]
    # priority bands first, fairness within a band
    reqs = [req(0, "a"), req(1, "a"), req(2, "b", prio=5), req(3, "c")]
    assert grant_order(offline_backend(order="priority"), reqs) == [0, 3, 1, 2]
    # without ids, the queue order as before
    reqs = [req(0, None), req(1, None), req(2, None)]
    assert grant_order(offline_backend(order="fcfs"), reqs) == [0, 1, 2]


def test_sheddable_requests_are_dropped_first_in_the_queue() -> None:
    b = offline_backend(max_queue=2, admission="queue")

    def req(k: int, sheddable: bool) -> GenerationRequest:
        r = greq(arrival=time.monotonic())
        r.request_id, r.sheddable = f"r{k}", sheddable
        return r

    async def main() -> list[str]:
        blocker = greq()
        b._take(0, blocker)  # the only slot is busy
        out: list[str] = []

        async def one(r: GenerationRequest) -> None:
            try:
                b._admit(r)
                i = await b._acquire(r, frozenset())
            except ServeError as e:
                out.append(f"{r.request_id}:{e.status}:{e.reason}")
                return
            out.append(f"{r.request_id}:granted")
            await asyncio.sleep(0.01)
            b._release(i, r, True)

        tasks = [
            asyncio.ensure_future(one(req(0, True))),
            asyncio.ensure_future(one(req(1, False))),
        ]
        await asyncio.sleep(0.01)
        assert b.queue_size == 2
        await one(req(2, True))  # queue full: a sheddable arrival is refused
        tasks.append(asyncio.ensure_future(one(req(3, False))))  # takes r0's place
        await asyncio.sleep(0.01)
        assert b.queue_size == 2
        await one(req(4, False))  # full of non-sheddable requests: queue_full
        b._release(0, blocker, True)
        await asyncio.gather(*tasks)
        return out

    out = asyncio.run(main())
    assert "r2:429:shed" in out
    assert "r0:429:shed" in out
    assert "r4:429:queue_full" in out
    assert b.rejected["shed"] == 2
    assert out.index("r1:granted") < out.index("r3:granted")
    assert b.in_flight == 0 and b.queue_size == 0


async def _post_each(url: str, body: dict[str, Any], headers: list[dict[str, str]]) -> list[Any]:
    async with httpx.AsyncClient(timeout=20) as c:

        async def one(k: int, h: dict[str, str]) -> Any:
            await asyncio.sleep(k * 0.05)
            r = await c.post(url + "/v1/completions", json=body, headers=h)
            return r.status_code, dict(r.headers), r.json()

        return await asyncio.gather(*(one(k, h) for k, h in enumerate(headers)))


def test_gateway_sheds_with_429_and_the_reason(fakes: Any) -> None:  # noqa: F811
    (u1, f1), _ = fakes
    f1.tokens, f1.delay = 4, 0.1  # 0.4 s per request: the slot and the queue place fill up
    cfg = UpstreamConfig(
        upstreams=(u1,), max_concurrency=1, max_queue=1, admission="queue", health_interval_s=0
    )
    backend = OpenAIUpstreamBackend(cfg)
    app = create_app(backend, GatewaySettings(objectives=OBJECTIVES))
    url, server, t = _serve(app, lifespan="on")
    body = {"model": "fake-model", "prompt": "hi", "max_tokens": 4}
    try:
        out = asyncio.run(_post_each(url, body, [
            {"x-gateway-inference-objective": "chat"},
            {"x-gateway-inference-objective": "batch"},  # queued, then displaced
            {"x-gateway-inference-objective": "chat"},
            {"x-gateway-inference-objective": "batch"},  # queue full: refused
        ]))  # fmt: skip
    finally:
        server.should_exit = True
        t.join(10)
    assert [s for s, _, _ in out] == [200, 429, 200, 429]
    for _, headers, err in (out[1], out[3]):
        assert headers["x-sloserve-drop-reason"] == "shed"
        assert int(headers["retry-after"]) >= 1
        assert err["error"]["code"] == "shed"


def test_objectives_file(tmp_path: Path) -> None:
    p = tmp_path / "obj.yaml"
    p.write_text("objectives:\n  chat: {priority: 10, ttft_ms: 300}\n  batch: {priority: -1}\n")
    got = load_objectives(p)
    assert got == {"chat": Objective(priority=10, ttft_ms=300), "batch": Objective(priority=-1)}
    assert got["batch"].sheddable and not got["chat"].sheddable
    p.write_text("chat: {priority: 1, ttft_ms: -5}\n")
    with pytest.raises(ConfigError, match=r"obj.yaml: objectives.chat.ttft_ms: "):
        load_objectives(p)
    p.write_text("chat: {priority: 1, speed: 3}\n")
    with pytest.raises(ConfigError, match=r"objectives.chat.speed"):
        load_objectives(p)
    p.write_text("'bad name': {}\n")
    with pytest.raises(ConfigError, match="objective name 'bad name'"):
        load_objectives(p)
    with pytest.raises(ValueError, match="objective name"):
        GatewaySettings(objectives={"a b": Objective()})


def test_cli_objectives_error_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "obj.yaml"
    p.write_text("chat: {priority: high}\n")
    proc = run_main(monkeypatch, capsys, "serve", "--objectives", str(p))
    assert_user_error(proc, "obj.yaml", "objectives.chat.priority")
