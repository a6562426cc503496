"""Runners: prepare and time one forward pass of our Llama model or a Hugging Face one.

Choices
-------
* Hugging Face models (a local path; needs ``transformers``, imported lazily, and loads with
  ``local_files_only=True``) are timed as a whole (no per-group times) through the model's
  own forward with a ``past_key_values`` cache built by a forward over random context
  tokens and copied before every measured pass. Only prefill-only shapes with one chunk and
  decode-only shapes with one shared context are supported there (HF forward takes one
  padded rectangle); others are skipped. HF computes logits for every input position unless
  the installed version accepts ``logits_to_keep``/``num_logits_to_keep``, which we pass.
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sloserve.core.errors import ConfigError
from sloserve.core.hardware import ModelSpec
from sloserve.costmodel.profiler.grid import IterationShape
from sloserve.costmodel.profiler.llama import LlamaModel, _torch
from sloserve.costmodel.profiler.timing import _Clock, _GroupTimer


@dataclass(frozen=True)
class _Sample:
    total: float
    groups: dict[str, float] | None


class _Runner:
    """Times iteration shapes on one model (ours or a Hugging Face one)."""

    spec: ModelSpec
    dtype_name: str
    supports_groups: bool = True

    def supports(self, shape: IterationShape) -> bool:
        """Whether this runner can build ``shape``."""
        raise NotImplementedError

    def prepare(self, shape: IterationShape) -> Any:
        """Inputs and caches for ``shape`` (untimed)."""
        raise NotImplementedError

    def run(self, prepared: Any, clock: _Clock, groups: bool) -> _Sample:
        """One timed forward pass."""
        raise NotImplementedError


class _OwnRunner(_Runner):
    def __init__(self, model: LlamaModel, kv_memory_gib: float, seed: int) -> None:
        self.model = model
        elem = model.torch.tensor([], dtype=model.dtype).element_size()
        self.spec = model.spec.model_copy(update={"dtype_bytes": elem})
        self.dtype_name = str(model.dtype).removeprefix("torch.")
        self.kv_memory_gib = kv_memory_gib
        self.seed = seed

    def supports(self, shape: IterationShape) -> bool:
        return True

    def prepare(self, shape: IterationShape) -> Any:
        return self.model.prepare(shape, self.seed, self.kv_memory_gib)

    def run(self, prepared: Any, clock: _Clock, groups: bool) -> _Sample:
        timer = _GroupTimer(clock) if groups else None
        clock.sync()
        t0 = clock.mark()
        self.model.forward(prepared, timer)
        t1 = clock.mark()
        clock.sync()
        return _Sample(clock.seconds(t0, t1), timer.totals() if timer is not None else None)


class _HFRunner(_Runner):
    supports_groups = False

    def __init__(self, path: str, device: Any, dtype: Any, seed: int) -> None:
        torch = _torch()
        try:
            tf = importlib.import_module("transformers")
        except ImportError:
            raise ConfigError(
                f"profiling the model at {path} needs transformers (pip install transformers); "
                "or profile a ModelSpec with the built-in model"
            ) from None
        try:
            self.model = tf.AutoModelForCausalLM.from_pretrained(
                path, local_files_only=True, torch_dtype=dtype
            )
        except (OSError, ValueError) as e:
            raise ConfigError(f"{path}: cannot load a causal LM ({str(e).splitlines()[0]})") from e
        self.model.to(device).eval()
        self.torch, self.device, self.seed = torch, device, seed
        self.cache_cls = getattr(tf, "DynamicCache", None)
        cfg = self.model.config
        params = int(sum(p.numel() for p in self.model.parameters()))
        self.spec = ModelSpec(
            name=str(getattr(cfg, "_name_or_path", "") or Path(path).name),
            num_layers=int(cfg.num_hidden_layers),
            hidden_size=int(cfg.hidden_size),
            num_heads=int(cfg.num_attention_heads),
            num_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads),
            intermediate_size=int(getattr(cfg, "intermediate_size", 0) or 0),
            vocab_size=int(getattr(cfg, "vocab_size", 0) or 0),
            params_b=params / 1e9,
            dtype_bytes=torch.tensor([], dtype=dtype).element_size(),
            max_context=int(getattr(cfg, "max_position_embeddings", 4096) or 4096),
        )
        self.dtype_name = str(dtype).removeprefix("torch.")
        # Newer forwards take **kwargs and would silently ignore an unknown keyword, so
        # a keyword counts as supported only when the logits really shrink to one position.
        self.keep_kw: dict[str, int] = {}
        ids = torch.zeros((1, 2), dtype=torch.long, device=device)
        for kw in ("logits_to_keep", "num_logits_to_keep"):
            try:
                with torch.inference_mode():
                    logits = self.model(input_ids=ids, **{kw: 1}).logits
            except (TypeError, ValueError):
                continue
            if logits.shape[1] == 1:
                self.keep_kw = {kw: 1}
                break

    def supports(self, shape: IterationShape) -> bool:
        return (len(shape.prefill) == 1 and not shape.decode) or (
            not shape.prefill and len(set(shape.decode)) == 1
        )

    def prepare(self, shape: IterationShape) -> Any:
        torch = self.torch
        gen = torch.Generator(device="cpu").manual_seed(self.seed)
        vocab = max(self.spec.vocab_size, 2)
        if shape.prefill:
            new, ctx = shape.prefill[0]
            b = 1
        else:
            ctx, b, new = shape.decode[0], len(shape.decode), 1
        past = None
        if ctx:
            ids = torch.randint(0, vocab, (b, ctx), generator=gen).to(self.device)
            # An explicit cache object where the version has one (tuples are deprecated).
            cache = self.cache_cls() if self.cache_cls is not None else None
            with torch.inference_mode():
                out = self.model(input_ids=ids, past_key_values=cache, use_cache=True)
            past = out.past_key_values
        return torch.randint(0, vocab, (b, new), generator=gen).to(self.device), past

    def run(self, prepared: Any, clock: _Clock, groups: bool) -> _Sample:
        ids, past = prepared
        kv = copy.deepcopy(past)  # the forward appends to the cache it is given
        clock.sync()
        t0 = clock.mark()
        with self.torch.inference_mode():
            self.model(input_ids=ids, past_key_values=kv, use_cache=True, **self.keep_kw)
        t1 = clock.mark()
        clock.sync()
        return _Sample(clock.seconds(t0, t1), None)
