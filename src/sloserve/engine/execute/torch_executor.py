""":class:`TorchExecutor`: the engine's executor running a real model (execute mode).

Each :meth:`TorchExecutor.run` syncs the paged cache with the KV manager (swap and
checkpoint copies included), runs one packed forward pass (:mod:`.runner`), samples the
next token of every request that emits one, and returns the **measured** wall time of all
of it (``torch.cuda.synchronize`` first on CUDA). It also prices the same iteration with
the cost model and keeps both (:attr:`TorchExecutor.records`) for the measured-vs-predicted
report (:mod:`.report`).

Token ids: a request's prompt is what :meth:`TorchExecutor.set_prompt` was given (the
gateway's tokenised prompt), else ``num_prompt_tokens`` ids drawn from
``numpy.random.default_rng((seed, req_id))``: a simulated workload has lengths, not text.
Generated tokens are the executor's own record (:meth:`tokens`); request state stays the
instance's. With an ``eos_id`` (a checkpoint's), sampling it ends the request
(:meth:`take_stops`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from sloserve.costmodel.base import BatchStats, CostModel
from sloserve.engine.execute.cache import PagedKVCache
from sloserve.engine.execute.runner import ModelRunner, SeqWork
from sloserve.engine.execute.weights import LoadedModel
from sloserve.engine.executor import ExecBatch, price


@dataclass(frozen=True)
class IterationRecord:
    """One executed iteration: its kind, size and times."""

    kind: str
    """``prefill``, ``decode`` or ``hybrid``."""
    num_tokens: int
    measured_s: float
    predicted_s: float
    stats: BatchStats | None = None
    """What the cost model priced (to score the same iteration against another model)."""
    overlap_swap: bool = False


class TorchExecutor:
    """Runs every iteration on a real model. ``loaded``: from
    :func:`~sloserve.engine.execute.weights.load_model`; ``cost_model``: for predictions."""

    fast_forward = False

    def __init__(
        self,
        loaded: LoadedModel,
        cost_model: CostModel,
        *,
        temperature: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.torch: Any = self.model.torch
        self.cost_model = cost_model
        self.seed = seed
        self.temperature = temperature
        self.name = f"torch:{loaded.name}@{self.model.device}"
        self.eos_id = loaded.eos_id
        self.cache: PagedKVCache | None = None
        self.runner: ModelRunner | None = None
        self.records: list[IterationRecord] = []
        self._prompts: dict[int, list[int]] = {}
        self._out: dict[int, list[int]] = {}
        self._stops: set[int] = set()
        self.on_tokens: Any = None
        """Optional ``callback(dict req_id -> token)`` after each iteration (the gateway)."""

    # ------------------------------------------------------------------ tokens
    def set_prompt(self, req_id: int, ids: list[int]) -> None:
        """The prompt's token ids (else random ids of the request's prompt length)."""
        vocab = self.model.spec.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            raise ValueError(f"request {req_id}: token id outside the vocabulary (size {vocab})")
        self._prompts[req_id] = list(ids)

    def prompt(self, req_id: int, length: int) -> list[int]:
        ids = self._prompts.get(req_id)
        if ids is None:
            rng = np.random.default_rng((self.seed, req_id))
            ids = rng.integers(0, self.model.spec.vocab_size, size=length).tolist()
            self._prompts[req_id] = ids
        return ids

    def tokens(self, req_id: int) -> list[int]:
        """Tokens generated for the request so far."""
        return self._out.get(req_id, [])

    def forget(self, req_id: int) -> None:
        """Drop a finished request's prompt and tokens."""
        self._prompts.pop(req_id, None)
        self._out.pop(req_id, None)

    def take_stops(self) -> set[int]:
        out, self._stops = self._stops, set()
        return out

    # ------------------------------------------------------------------ one iteration
    def _setup(self, batch: ExecBatch) -> tuple[PagedKVCache, ModelRunner]:
        if self.cache is None or self.runner is None:
            spec, kv = self.model.spec, batch.kv
            self.cache = PagedKVCache(
                self.torch,
                kv.num_blocks * kv.block_size,
                spec.num_layers,
                spec.num_kv_heads,
                spec.head_dim,
                device=self.model.device,
                dtype=self.model.dtype,
            )
            self.runner = ModelRunner(
                self.model, self.cache, temperature=self.temperature, seed=self.seed
            )
        return self.cache, self.runner

    def run(self, batch: ExecBatch) -> float:
        torch = self.torch
        cuda = self.model.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        cache, runner = self._setup(batch)
        need: dict[int, int] = {}
        work: list[SeqWork] = []
        for r, n in batch.batch:
            cache.track(r)
            start = r.num_computed_tokens
            need[r.req_id] = start + n
            out = self._out.setdefault(r.req_id, [])
            if len(out) != r.num_output_tokens:  # the engine and this record disagree
                del out[r.num_output_tokens :]
            seq_len = r.num_prompt_tokens + r.num_output_tokens
            prompt = self.prompt(r.req_id, r.num_prompt_tokens)
            ids = [
                prompt[p] if p < r.num_prompt_tokens else out[p - r.num_prompt_tokens]
                for p in range(start, start + n)
            ]
            work.append(SeqWork(r.req_id, ids, start, start + n == seq_len))
        with torch.inference_mode():
            cache.sync(batch.kv, need)
            picks = runner.forward(work)
        if cuda:
            torch.cuda.synchronize()
        measured = time.perf_counter() - t0
        for rid, tok in picks.items():
            self._out[rid].append(tok)
            if self.eos_id is not None and tok == self.eos_id:
                self._stops.add(rid)
        st = batch.stats
        kind = (
            "hybrid"
            if st.num_prefill_tokens and st.num_decode
            else "prefill"
            if st.num_prefill_tokens
            else "decode"
        )
        predicted = price(self.cost_model, st, batch.overlap_swap)
        self.records.append(
            IterationRecord(kind, st.total_tokens, measured, predicted, st, batch.overlap_swap)
        )
        if self.on_tokens is not None:
            self.on_tokens(picks)
        return measured
