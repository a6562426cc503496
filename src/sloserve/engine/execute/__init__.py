"""Execute mode: the engine's executor runs a real PyTorch model.

:class:`TorchExecutor` plugs into :class:`~sloserve.engine.instance.Instance` through the
executor seam (:mod:`sloserve.engine.executor`): same instance, KV managers and policies,
but each iteration is a real forward pass whose measured wall time is its duration. Parts:
the model to run (:mod:`.weights`), the paged KV cache laid out by the KV manager
(:mod:`.cache`), the packed forward pass and sampling (:mod:`.runner`), the executor
(:mod:`.torch_executor`) and the measured-vs-predicted report (:mod:`.report`). PyTorch is
imported only when a model is built, so importing this package does not load it.
"""

from sloserve.engine.execute.cache import ExecutionError, PagedKVCache
from sloserve.engine.execute.report import timing_report
from sloserve.engine.execute.runner import ModelRunner, SeqWork
from sloserve.engine.execute.torch_executor import IterationRecord, TorchExecutor
from sloserve.engine.execute.weights import LoadedModel, load_model, resolve_device

__all__ = [
    "ExecutionError",
    "IterationRecord",
    "LoadedModel",
    "ModelRunner",
    "PagedKVCache",
    "SeqWork",
    "TorchExecutor",
    "load_model",
    "resolve_device",
    "timing_report",
]
