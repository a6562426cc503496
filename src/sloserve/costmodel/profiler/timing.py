"""Clocks for one forward pass: the whole pass and its attention calls by kind.

CUDA: ``torch.cuda.synchronize`` around the pass and CUDA events (no
synchronisation inside the pass); CPU: ``time.perf_counter`` (the *Timing* choice of
:mod:`.measure` says how passes are repeated and summarised).

Choices
-------
* Per-group times (``measure_groups``): ``time_decode_attention_s`` and
  ``time_prefill_attention_s`` are the summed time of the attention calls (cache write,
  attention, output copy) of each kind; ``time_non_attention_s`` is the rest of the pass.
  On CUDA each attention call is bracketed by events; on CPU by ``perf_counter``. TP is 1,
  so there is no ``time_comm_s``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


class _Clock:
    """perf_counter on CPU; CUDA events (read after one synchronize) on CUDA."""

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch = torch
        self.cuda = device.type == "cuda"
        self.device = device

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def mark(self) -> Any:
        if self.cuda:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def seconds(self, a: Any, b: Any) -> float:
        """Elapsed seconds between two marks (call after :meth:`sync` on CUDA)."""
        if self.cuda:
            return float(a.elapsed_time(b)) / 1e3
        return float(b - a)


@dataclass
class _GroupTimer:
    """Brackets attention calls inside a forward pass, by kind."""

    clock: _Clock
    spans: list[tuple[str, Any, Any]] = field(default_factory=list)

    def start(self) -> Any:
        return self.clock.mark()

    def stop(self, kind: str, mark: Any) -> None:
        self.spans.append((kind, mark, self.clock.mark()))

    def totals(self) -> dict[str, float]:
        out = {"decode": 0.0, "prefill": 0.0}
        for kind, a, b in self.spans:
            out[kind] += self.clock.seconds(a, b)
        return out
