"""The iterations a profile measures: :class:`IterationShape` and the default grid.

Choices
-------
* Decode requests read ``ctx`` cached tokens plus their own new one;
  ``decode_context_sum = Σ ctx`` and ``prefill_attn_work = Σ c·(c + ctx)``, exactly as
  ``engine.instance`` builds :class:`~sloserve.costmodel.base.BatchStats`. Decode rows are
  measured only at contexts ≥ 1 (a decode always has its prompt cached).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sloserve.core.errors import ConfigError
from sloserve.costmodel.base import BatchStats

DEFAULT_PREFILL_CHUNKS: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
DEFAULT_DECODE_BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_CONTEXTS: tuple[int, ...] = (0, 128, 512, 1024)


@dataclass(frozen=True)
class IterationShape:
    """One iteration to measure: prefill chunks and decode requests.

    ``prefill`` holds ``(chunk tokens, cached context)`` per prefill sequence; ``decode``
    holds the cached context of each decode request.
    """

    prefill: tuple[tuple[int, int], ...] = ()
    decode: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.prefill and not self.decode:
            raise ConfigError("an iteration shape needs a prefill chunk or a decode request")
        for c, ctx in self.prefill:
            if c < 1 or ctx < 0:
                raise ConfigError(f"prefill chunk {c} with context {ctx}: need c >= 1, ctx >= 0")
        if any(ctx < 1 for ctx in self.decode):
            raise ConfigError("a decode request needs a cached context >= 1")

    @property
    def stats(self) -> BatchStats:
        """The aggregates the simulator would compute for this iteration."""
        return BatchStats(
            num_prefill_tokens=sum(c for c, _ in self.prefill),
            num_prefill_seqs=len(self.prefill),
            prefill_attn_work=sum(c * (c + ctx) for c, ctx in self.prefill),
            num_decode=len(self.decode),
            decode_context_sum=sum(self.decode),
        )

    @property
    def kind(self) -> str:
        """``prefill``, ``decode`` or ``hybrid``."""
        if self.prefill and self.decode:
            return "hybrid"
        return "prefill" if self.prefill else "decode"

    @property
    def max_position(self) -> int:
        """The longest sequence (cached + new tokens) in the iteration."""
        return max([c + ctx for c, ctx in self.prefill] + [ctx + 1 for ctx in self.decode])


def profile_grid(
    prefill_chunks: Sequence[int] = DEFAULT_PREFILL_CHUNKS,
    decode_batches: Sequence[int] = DEFAULT_DECODE_BATCHES,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    hybrid: bool = True,
) -> list[IterationShape]:
    """The shapes :func:`profile_model` measures by default.

    Prefill: one chunk of every size at every context. Decode: every batch size at every
    context ≥ 1 (all requests the same context). Hybrid (``hybrid=True``): every decode batch
    size at the largest context together with every chunk size at context 0, which checks
    that the terms add up in the mixed batches chunked-prefill schedulers build.
    """
    if any(c < 1 for c in prefill_chunks) or any(b < 1 for b in decode_batches):
        raise ConfigError("prefill chunks and decode batch sizes must be >= 1")
    if any(ctx < 0 for ctx in contexts):
        raise ConfigError("contexts must be >= 0")
    shapes = [IterationShape(prefill=((c, ctx),)) for c in prefill_chunks for ctx in contexts]
    dec_ctx = [ctx for ctx in contexts if ctx >= 1]
    shapes += [IterationShape(decode=(ctx,) * b) for b in decode_batches for ctx in dec_ctx]
    if hybrid and dec_ctx:
        top = max(dec_ctx)
        shapes += [
            IterationShape(prefill=((c, 0),), decode=(top,) * b)
            for b in decode_batches
            for c in prefill_chunks
        ]
    return shapes
