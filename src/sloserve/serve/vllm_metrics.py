"""vLLM's Prometheus metrics, exported by the emulated backend's replicas (and the local
backend's one replica, read between its worker thread's steps).

An llm-d endpoint picker, a Dynamo planner or a Grafana board built for vLLM reads these
names as it reads a vLLM engine's ``/metrics``; sloserve's own ``openai`` backend parses
them with :func:`sloserve.serve.scrape.parse_engine_load` too. Names, types and units are
vLLM's (v1 engine, ``vllm/v1/metrics/loggers.py``); the labels are vLLM's ``model_name``
and ``engine`` (the replica index, as vLLM numbers its data-parallel engines) plus
``replica`` (sloserve's replica name, the label of the ``sloserve_replica_*`` gauges):

* gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` (swapped included,
  as vLLM v1 counts them), ``vllm:kv_cache_usage_perc`` (a fraction 0..1, despite its name);
* counters ``vllm:num_preemptions_total``, ``vllm:prompt_tokens_total``,
  ``vllm:generation_tokens_total`` (tokens counted when their request finishes);
* histograms ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``
  and its older name ``vllm:time_per_output_token_seconds`` (one observation per token gap,
  the same values as vLLM v1 gives both), ``vllm:e2e_request_latency_seconds``, with vLLM's
  buckets, of the requests each engine finished.

Times are the engine's, in wall seconds as a client sees them: simulated seconds divided by
``--time-scale``. The histograms take in newly finished requests at scrape time (the
collector remembers how far it read each engine's ``done`` list), so serving costs nothing
between scrapes. Under ``--workers N`` they are the answering process's, like the gauges.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from sloserve.serve.emulated import EmulatedBackend

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""vLLM's buckets of ``vllm:time_to_first_token_seconds``."""
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
"""vLLM's buckets of ``vllm:inter_token_latency_seconds``."""
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
"""vLLM's buckets of ``vllm:e2e_request_latency_seconds``."""

_LABELS = ["model_name", "engine", "replica"]


class _Hist:
    """Cumulative bucket counts and sum of one histogram series."""

    __slots__ = ("counts", "edges", "total")

    def __init__(self, edges: Sequence[float]) -> None:
        self.edges = np.asarray(edges, dtype=np.float64)
        self.counts = np.zeros(len(edges) + 1, dtype=np.int64)  # the last: above every edge
        self.total = 0.0

    def observe(self, values: np.ndarray) -> None:
        if values.size:
            # le semantics: a value equal to an edge falls in that edge's bucket
            idx = np.searchsorted(self.edges, values, side="left")
            self.counts += np.bincount(idx, minlength=len(self.counts))
            self.total += float(values.sum())

    def buckets(self) -> list[tuple[str, float]]:
        cum = np.cumsum(self.counts)
        les = [*(repr(float(e)) for e in self.edges), "+Inf"]
        return [(le, float(c)) for le, c in zip(les, cum, strict=True)]


class _Engine:
    """What the collector accumulated of one replica."""

    __slots__ = ("e2e", "gen_tokens", "itl", "prompt_tokens", "read", "ttft")

    def __init__(self) -> None:
        self.ttft = _Hist(TTFT_BUCKETS)
        self.itl = _Hist(ITL_BUCKETS)
        self.e2e = _Hist(E2E_BUCKETS)
        self.prompt_tokens = 0
        self.gen_tokens = 0
        self.read: dict[int, int] = {}
        """How many of each incarnation's ``done`` requests were taken in, by instance id."""


class VllmEngineCollector(Collector):
    """vLLM's metrics of every replica of an :class:`EmulatedBackend` (see module doc)."""

    def __init__(self, backend: EmulatedBackend) -> None:
        self.backend = backend
        self._engines: dict[int, _Engine] = {}

    def _ingest(self, eng: _Engine, incarnations: Sequence[object]) -> None:
        scale = self.backend.scale
        for inst in incarnations:
            done = inst.done  # type: ignore[attr-defined]
            iid: int = inst.instance_id  # type: ignore[attr-defined]
            start = eng.read.get(iid, 0)
            if start == len(done):
                continue
            eng.read[iid] = len(done)
            ends = np.asarray(inst.iter_end, dtype=np.float64)  # type: ignore[attr-defined]
            ttfts, e2es, gaps = [], [], []
            for r in done[start:]:
                eng.prompt_tokens += r.num_prompt_tokens
                eng.gen_tokens += r.num_output_tokens
                if r.first_token_time is not None:
                    ttfts.append(r.first_token_time - r.arrival)
                if r.finish_time is not None:
                    e2es.append(r.finish_time - r.arrival)
                its = r.token_iterations()
                if len(its) > 1:
                    gaps.append(np.diff(ends[np.asarray(its, dtype=np.int64)]))
            eng.ttft.observe(np.asarray(ttfts, dtype=np.float64) / scale)
            eng.e2e.observe(np.asarray(e2es, dtype=np.float64) / scale)
            if gaps:
                eng.itl.observe(np.concatenate(gaps) / scale)

    def collect(self) -> Iterator[Metric]:
        be = self.backend
        clu = be._cluster
        g_run = GaugeMetricFamily(
            "vllm:num_requests_running", "Number of requests in model execution batches.",
            labels=_LABELS,
        )  # fmt: skip
        g_wait = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.",
            labels=_LABELS,
        )  # fmt: skip
        g_kv = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
            labels=_LABELS,
        )  # fmt: skip
        c_pre = CounterMetricFamily(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.",
            labels=_LABELS,
        )  # fmt: skip
        c_prompt = CounterMetricFamily(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels=_LABELS
        )
        c_gen = CounterMetricFamily(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels=_LABELS
        )
        h_ttft = HistogramMetricFamily(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            labels=_LABELS,
        )  # fmt: skip
        h_itl = HistogramMetricFamily(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            labels=_LABELS,
        )  # fmt: skip
        h_tpot = HistogramMetricFamily(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds (deprecated name of "
            "vllm:inter_token_latency_seconds).",
            labels=_LABELS,
        )  # fmt: skip
        h_e2e = HistogramMetricFamily(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.", labels=_LABELS,
        )  # fmt: skip
        with be.engine_read():  # the local backend's worker is not mid-step meanwhile
            if clu is not None:
                for rep in clu.replicas:
                    rid = rep.replica_id
                    v = clu.view.replica(rid)
                    labels = [v.model, str(rid), v.name]
                    eng = self._engines.setdefault(rid, _Engine())
                    self._ingest(eng, rep.incarnations)
                    g_run.add_metric(labels, float(v.running))
                    g_wait.add_metric(labels, float(v.waiting + v.swapped))
                    g_kv.add_metric(labels, float(v.kv_usage))
                    c_pre.add_metric(labels, float(rep.preemptions()))
                    c_prompt.add_metric(labels, float(eng.prompt_tokens))
                    c_gen.add_metric(labels, float(eng.gen_tokens))
                    h_ttft.add_metric(labels, eng.ttft.buckets(), eng.ttft.total)
                    h_itl.add_metric(labels, eng.itl.buckets(), eng.itl.total)
                    h_tpot.add_metric(labels, eng.itl.buckets(), eng.itl.total)
                    h_e2e.add_metric(labels, eng.e2e.buckets(), eng.e2e.total)
        yield from (g_run, g_wait, g_kv, c_pre, c_prompt, c_gen, h_ttft, h_itl, h_tpot, h_e2e)
