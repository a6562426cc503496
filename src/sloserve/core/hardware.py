"""Model and GPU facts that size the KV cache and parameterise cost models.

Both specs are frozen pydantic models; every field added after the first profiles were
written has a default, so older profile YAML files still validate. Values come from public
sources: a model's Hugging Face ``config.json`` and a GPU's data sheet (the catalog in
``sloserve/costmodel/specs/`` cites them).

Choices where the sources leave room:

* ``ModelSpec.params_b`` is the published parameter count (it sizes the weights in memory);
  :meth:`ModelSpec.param_count` recomputes it from the shapes as a consistency check.
* MoE: ``num_experts`` experts of ``intermediate_size`` each, ``experts_per_token`` of them
  used per token; a dense model is ``num_experts = experts_per_token = 1``.
* When the tensor-parallel degree exceeds ``num_kv_heads`` the KV heads are replicated, one
  per GPU (as vLLM does), so the KV bytes of a token over the whole replica grow with TP:
  :meth:`ModelSpec.kv_bytes_per_token_tp`.
* ``GPUSpec`` peak rates are the data sheets' **dense** tensor-core numbers (the sparse
  ones are 2×). A 2-byte model runs at the BF16 rate, or the FP16 rate where the GPU has no
  BF16 (V100); see :meth:`GPUSpec.peak_tflops`.
* ``memory_gib`` is the data sheet's capacity read as GiB (an A100-80GB reports 81,920 MiB,
  i.e. exactly 80 GiB; an H100-80GB 81,559 MiB, 0.4% less; the difference is ignored).
* ``nvlink_gb_per_s`` is the NVLink bandwidth per direction per GPU (half the data sheet's
  bidirectional figure); ``nvlink_gpus`` is how many GPUs one NVLink domain joins (8 on an
  HGX/DGX board with NVSwitch, 2 for cards joined by an NVLink bridge). Tensor parallelism
  beyond that domain goes over PCIe.
* ``pcie_gb_per_s`` is an *effective* host<->GPU rate (about 80% of the link's nominal
  per-direction rate: 25 GB/s for Gen4 x16, 50 GB/s for Gen5 x16, 12 GB/s for Gen3 x16).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator


class SpecModel(BaseModel):
    """A frozen spec read from YAML: no unknown keys, no infinite or NaN numbers (``.inf``
    in a file would only fail later, deep in KV sizing), and no boolean where a number is
    expected (YAML 1.1 reads ``yes``/``no``/``on``/``off`` as booleans, which pydantic
    would otherwise take as 1 and 0: ``num_layers: yes`` would be one layer)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if (
            isinstance(value, bool)
            and info.field_name is not None
            and cls.model_fields[info.field_name].annotation is not bool
        ):
            raise ValueError(
                f"expected a number, not the boolean {str(value).lower()} "
                "(YAML reads yes/no/on/off as booleans)"
            )
        return value


class ModelSpec(SpecModel):
    """A decoder-only transformer's shape (from its public config.json)."""

    name: str
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    intermediate_size: int = Field(
        default=0, ge=0, description="MLP width (of one expert, for MoE models)"
    )
    vocab_size: int = Field(default=0, ge=0)
    params_b: float = Field(gt=0, description="parameters, in billions")
    dtype_bytes: int = Field(default=2, gt=0)
    max_context: int = Field(default=4096, gt=0)
    gated_mlp: bool = Field(
        default=True, description="SwiGLU-style MLP (gate, up, down) rather than up, down"
    )
    tied_embeddings: bool = Field(
        default=False, description="the LM head shares the token-embedding matrix"
    )
    num_experts: int = Field(default=1, ge=1, description="MLP experts per layer (1 = dense)")
    experts_per_token: int = Field(default=1, ge=1, description="experts each token uses")

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"experts_per_token ({self.experts_per_token}) > num_experts ({self.num_experts})"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        return self

    @property
    def head_dim(self) -> int:
        """Width of one attention head (``hidden_size / num_heads``)."""
        return self.hidden_size // self.num_heads

    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model."""
        return self.num_experts > 1

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer, all tensor-parallel shards together."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def kv_heads_per_gpu(self, tp: int) -> int:
        """KV heads each GPU holds at tensor-parallel degree ``tp`` (replicated if tp > heads)."""
        return max(1, self.num_kv_heads // tp)

    def kv_bytes_per_token_tp(self, tp: int) -> int:
        """KV bytes of one token over the whole replica at ``tp`` (replication included)."""
        return (
            2
            * self.num_layers
            * self.kv_heads_per_gpu(tp)
            * tp
            * self.head_dim
            * (self.dtype_bytes)
        )

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights (``params_b`` × dtype bytes)."""
        return self.params_b * 1e9 * self.dtype_bytes

    def layer_params(self) -> int:
        """Parameters of one transformer layer (matrices only; norms are negligible)."""
        h, d = self.hidden_size, self.head_dim
        attn = h * (self.num_heads + 2 * self.num_kv_heads) * d + self.num_heads * d * h
        mlp_mats = 3 if self.gated_mlp else 2
        mlp = self.num_experts * mlp_mats * h * self.intermediate_size
        router = h * self.num_experts if self.is_moe else 0
        return attn + mlp + router + 2 * h

    def param_count(self) -> int:
        """Parameters recomputed from the shapes (for checking ``params_b``)."""
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)
        return self.num_layers * self.layer_params() + embeddings + self.hidden_size


class GPUSpec(SpecModel):
    """One accelerator's compute, memory and link facts (public data sheets)."""

    name: str
    memory_gib: float = Field(gt=0)
    pcie_gb_per_s: float = Field(default=25.0, gt=0, description="effective host<->GPU GB/s")
    bf16_tflops: float | None = Field(default=None, gt=0)
    hbm_tb_per_s: float | None = Field(default=None, gt=0)
    fp16_tflops: float | None = Field(default=None, gt=0, description="dense FP16 tensor")
    fp8_tflops: float | None = Field(default=None, gt=0, description="dense FP8 tensor")
    int8_tops: float | None = Field(default=None, gt=0, description="dense INT8 tensor")
    fp32_tflops: float | None = Field(default=None, gt=0, description="FP32 (non-tensor)")
    nvlink_gb_per_s: float | None = Field(
        default=None, gt=0, description="NVLink GB/s per direction per GPU; None = no NVLink"
    )
    nvlink_gpus: int = Field(default=1, ge=1, description="GPUs one NVLink domain joins")

    def peak_tflops(self, dtype_bytes: int = 2) -> float:
        """Dense peak TFLOP/s for operands of ``dtype_bytes`` bytes.

        2 bytes: BF16, else FP16; 1 byte: FP8, else INT8 (TOPS), else the 2-byte rate;
        4 bytes: FP32. Raises ``ValueError`` when the data sheet gives no such rate.
        """
        if dtype_bytes == 1:
            options = [self.fp8_tflops, self.int8_tops, self.bf16_tflops, self.fp16_tflops]
        elif dtype_bytes == 2:
            options = [self.bf16_tflops, self.fp16_tflops]
        else:
            options = [self.fp32_tflops]
        for v in options:
            if v is not None:
                return v
        raise ValueError(f"GPU {self.name}: no peak rate for {dtype_bytes}-byte operands")

    @property
    def hbm_bytes_per_s(self) -> float:
        """Memory bandwidth in bytes/s; raises ``ValueError`` when it is not given."""
        if self.hbm_tb_per_s is None:
            raise ValueError(f"GPU {self.name}: hbm_tb_per_s is not set")
        return self.hbm_tb_per_s * 1e12

    def link_bytes_per_s(self, tp: int) -> float:
        """Per-direction bandwidth a ring all-reduce over ``tp`` GPUs gets (bytes/s).

        NVLink when the GPUs fit in one NVLink domain, else the (effective) PCIe rate.
        """
        if self.nvlink_gb_per_s is not None and tp <= self.nvlink_gpus:
            return self.nvlink_gb_per_s * 1e9
        return self.pcie_gb_per_s * 1e9

    def uses_nvlink(self, tp: int) -> bool:
        """Whether an all-reduce over ``tp`` GPUs stays on NVLink."""
        return self.nvlink_gb_per_s is not None and tp <= self.nvlink_gpus
