"""Measure real forward passes of a causal LM and write them as a profile CSV.

:func:`profile_model` times iterations of a Llama-style model on CPU or CUDA and returns
fits (documented in :mod:`sloserve.costmodel.fit.profile_csv`)::

    df = profile_model(tiny_llama_spec())          # seconds on a laptop CPU
    write_profile_csv(df, "tiny.csv")
    coefficients, report = fit_profile_csv("tiny.csv")

PyTorch is imported lazily (``import sloserve.costmodel.profiler`` works without it) and
through :mod:`importlib`, so the module type-checks with or without torch installed: torch
values are ``Any`` here. The model is therefore written functionally (weights in a plain
object, ``torch.nn.functional`` ops) rather than as ``nn.Module`` subclasses.

What one measurement is (how it maps to the simulator's iteration)
------------------------------------------------------------------
The simulator charges ``CostModel.batch_time(stats)`` per engine iteration: one forward pass
over every token scheduled in it. A measurement is exactly that forward pass, vLLM-style:
the iteration's tokens are **packed** into one ``[T, hidden]`` tensor (no padding), so every
non-attention operator (embedding, RMSNorms, fused QKV projection, rotary embedding, output
projection, gated MLP, residual adds) runs once over ``T`` tokens, and attention runs per
sequence group against that group's KV cache: all decode requests with the same cached
context in one ``scaled_dot_product_attention`` call (one query each), every prefill chunk
in its own call (``c`` queries over ``ctx + c`` keys, causal). The new tokens' K and V are
written into the cache inside the measured time. The LM head runs on the last token of every
sequence (what a sampler needs), not on every prefill token. **Included**: that whole forward
pass including the LM head. **Excluded**: sampling, detokenisation, scheduling and input
preparation (token ids, positions, masks and the caches are built before the clock starts),
and the host↔device copy of the inputs. Those are CPU-side costs the simulator's
``intercept`` could carry; they are not measured here.

Parts: the iterations to measure (:mod:`.grid`), the Llama-style model written in torch
(:mod:`.llama`), the clocks (:mod:`.timing`), the runners that time one pass of our model or
a Hugging Face one (:mod:`.runners`) and the measurement driver (:mod:`.measure`). Each
module's docstring lists the choices made in it.
"""

from sloserve.costmodel.profiler.grid import IterationShape, profile_grid
from sloserve.costmodel.profiler.llama import LlamaModel, llama_param_count, tiny_llama_spec
from sloserve.costmodel.profiler.measure import profile_model, write_profile_csv

__all__ = [
    "IterationShape",
    "LlamaModel",
    "llama_param_count",
    "profile_grid",
    "profile_model",
    "tiny_llama_spec",
    "write_profile_csv",
]
