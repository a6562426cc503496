"""Serving: the OpenAI-compatible gateway and the client-side token pacer.

* :mod:`sloserve.serve.api` — ``create_app(backend, settings)``: the FastAPI app
  (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``,
  ``/metrics``), with :mod:`~sloserve.serve.api_errors` (OpenAI error bodies),
  :mod:`~sloserve.serve.api_inputs` (SLO inputs from body and headers) and
  :mod:`~sloserve.serve.api_stream` (the SSE response, client disconnects);
  :mod:`sloserve.serve.server` — running it under uvicorn with a graceful drain;
* :mod:`sloserve.serve.backend` — the contract between the API and what generates tokens;
* :mod:`sloserve.serve.emulated` — a simulated cluster (:mod:`sloserve.cluster`) stepped in
  wall-clock time;
* :mod:`sloserve.serve.upstream` — a proxy to real OpenAI-compatible engines, with
  :mod:`~sloserve.serve.upstream_config` (its options), :mod:`~sloserve.serve.upstream_queue`
  (estimates, admission, queue) and :mod:`~sloserve.serve.upstream_wire` (body and SSE
  parsing);
* :mod:`sloserve.serve.replica_view` — the gateway's replicas as the cluster routers'
  ``ClusterView`` (routers: :mod:`sloserve.cluster.routing`, shared with simulation);
  :mod:`sloserve.serve.metrics` — Prometheus;
* :mod:`sloserve.serve.schemas` — request/response shapes; :mod:`sloserve.serve.pacer` —
  Andes' token pacer.

Importing this package loads no web framework: FastAPI and friends load lazily in the
modules that need them (``api*``, ``server``, ``metrics``), which simulation code never
imports.
"""
