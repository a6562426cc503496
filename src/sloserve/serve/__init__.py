"""Serving: the OpenAI-compatible gateway and the client-side token pacer.

* :mod:`sloserve.serve.api` — ``create_app(backend, settings)``: the FastAPI app
  (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``,
  ``/metrics``);
* :mod:`sloserve.serve.backend` — the contract between the API and what generates tokens;
* :mod:`sloserve.serve.emulated` — replicas of the simulation engine in wall-clock time;
* :mod:`sloserve.serve.upstream` — a proxy to real OpenAI-compatible engines;
* :mod:`sloserve.serve.routing` — routers; :mod:`sloserve.serve.metrics` — Prometheus;
* :mod:`sloserve.serve.schemas` — request/response shapes; :mod:`sloserve.serve.pacer` —
  Andes' token pacer.

Importing this package loads no web framework: FastAPI and friends load lazily in the
modules that need them (``api``, ``metrics``), which simulation code never imports.
"""
