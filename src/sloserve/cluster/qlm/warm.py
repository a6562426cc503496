"""QLM's model warm start (§5 of ``papers/qlm.txt``): which models a replica keeps in its
CPU memory, counted in bytes, and what reading them there from disk costs.

§5: "any model that needs to be served ... has to undergo two distinct swaps: (1)
Storage-CPU ... (2) CPU-GPU. ... The model for the head request of the virtual queue is
currently active and should be placed in the GPU memory. Models present later in the
virtual queue are warm and placed in the CPU memory until all the CPU memory is
exhausted." So, per replica (:class:`CPUMemory`):

- **Wanted**: the model the replica is changing to (its load is committed, even once its
  groups have left the queue: pulled by another replica or replanned), then the models of
  the replica's virtual queue in queue order, the GPU's model excluded, each kept while
  the running total of weight bytes fits ``capacity_bytes`` (a model that does not fit is
  skipped, a smaller later one may still fit);
  ``max_models`` optionally caps their count as well.
- **Prefetch is not free**: a wanted model not yet in CPU memory is read from disk at
  ``disk_bytes_per_s``, one model after another (one read stream per replica); it counts
  as warm only once its read has ended. A model no longer wanted is dropped at once (a
  read not yet started is cancelled; a read in progress still occupies the stream).
- **A load during a read**: a model change whose model's read has begun (not ended, or
  ended since the last update) waits for the rest of that read and then loads from CPU
  memory, when that is quicker than a cold load (the cluster's tier ``read``; the hook is
  ``cluster/lifecycle.py``'s :class:`ReadsIntoCPU`). The read is the same disk traffic
  either way; only its rest remains.
- **A model leaving the GPU** stays in CPU memory when it is still wanted (a choice: its
  weights reached the GPU through host memory, or are copied back at PCIe speed during the
  drain before the change; either is hidden by the drain).
- Memory used by GPU↔CPU KV swapping is not subtracted (a choice: the paper sizes the two
  separately, and our KV swap has its own CPU tier in the engine).

The default capacity is 144 GiB per replica: an AWS p4de.24xlarge has 8 A100-80GB and
1,152 GiB of host memory (torchx's resource table,
https://github.com/meta-pytorch/torchx/blob/main/torchx/specs/named_resources_aws.py),
i.e. 144 GiB per GPU. The paper does not state its hosts' memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sloserve.core.errors import ConfigError, UnknownNameError
from sloserve.costmodel.catalog import model_spec

GIB = float(1 << 30)
DEFAULT_CPU_MEM_GIB = 144.0
"""Host memory per replica for model weights (module docstring)."""


def catalog_weight_bytes(model: str) -> float | None:
    """A model's checkpoint bytes from the spec catalog, or None when it is not there."""
    try:
        return float(model_spec(model).weight_bytes)
    except (UnknownNameError, ConfigError):
        return None


@dataclass
class CPUMemory:
    """One replica's host memory for model weights and its disk read stream (module
    docstring). Times are the simulation's clock (s)."""

    capacity_bytes: float
    disk_bytes_per_s: float
    max_models: int | None = None
    resident: set[str] = field(default_factory=set)
    reads: list[tuple[str, float, float]] = field(default_factory=list)
    """(model, start, end) of the reads not ended yet, in stream order."""
    bytes_read: float = 0.0
    """Weight bytes whose read into CPU memory has ended (the prefetch traffic)."""
    _gpu: str | None = None

    def update(
        self, queue_models: Iterable[str], gpu_model: str, size: Callable[[str], float], now: float
    ) -> set[str]:
        """Advance to ``now`` and return the models warm (resident) in CPU memory."""
        if self._gpu is not None and self._gpu != gpu_model:
            self.resident.add(self._gpu)  # left the GPU: kept if still wanted (below)
        self._gpu = gpu_model
        self.resident.discard(gpu_model)
        wanted = self._wanted(queue_models, gpu_model, size)
        # reads that ended join the resident set; unwanted ones not started are cancelled
        left: list[tuple[str, float, float]] = []
        for m, start, end in self.reads:
            if end <= now:
                self.bytes_read += size(m)
                if m in wanted:
                    self.resident.add(m)
            elif m in wanted or start <= now:
                left.append((m, start, end))
        self.resident &= set(wanted)
        busy = max((end for _, _, end in left), default=now)
        reading = {m for m, _, _ in left}
        for m in wanted:
            if m in self.resident or m in reading:
                continue
            b = size(m)
            start = max(now, busy)
            busy = start + b / self.disk_bytes_per_s
            left.append((m, start, busy))
        self.reads = left
        return set(self.resident)

    def read_end(self, model: str, now: float) -> float | None:
        """When the read of ``model`` that has begun by ``now`` ends (``None``: none has
        begun). A load that starts meanwhile waits for its rest instead of reading the
        whole model again (``cluster/lifecycle.py``, :class:`ReadsIntoCPU`)."""
        for m, start, end in self.reads:
            if m == model and start <= now:
                return end
        return None

    def _wanted(
        self, queue_models: Iterable[str], gpu_model: str, size: Callable[[str], float]
    ) -> list[str]:
        out: list[str] = []
        used = 0.0
        for m in queue_models:
            if m == gpu_model or m in out or m == "default":
                continue
            if self.max_models is not None and len(out) >= self.max_models:
                break
            b = size(m)
            if used + b <= self.capacity_bytes:
                out.append(m)
                used += b
        return out


def make_cpu_memory(
    cpu_mem_gib: float, disk_gb_per_s: float, max_models: int | None
) -> Callable[[], CPUMemory]:
    """A factory of per-replica :class:`CPUMemory` (validated: one-line ConfigError)."""
    if not 0 <= cpu_mem_gib <= 1 << 20:
        raise ConfigError(f"router_params.cpu_mem_gib: must be in [0, 1048576], got {cpu_mem_gib}")
    if not 0 < disk_gb_per_s <= 1e4:
        raise ConfigError(
            f"router_params.disk_gb_per_s: must be in (0, 10000], got {disk_gb_per_s}"
        )
    return lambda: CPUMemory(cpu_mem_gib * GIB, disk_gb_per_s * 1e9, max_models)
