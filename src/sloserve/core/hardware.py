"""Model and GPU facts that size the KV cache and parameterise cost models."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ModelSpec(BaseModel):
    """A decoder-only transformer's shape (from its public config.json)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    intermediate_size: int = Field(default=0, ge=0)
    vocab_size: int = Field(default=0, ge=0)
    params_b: float = Field(gt=0, description="parameters, in billions")
    dtype_bytes: int = Field(default=2, gt=0)
    max_context: int = Field(default=4096, gt=0)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer, all tensor-parallel shards together."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.dtype_bytes


class GPUSpec(BaseModel):
    """One accelerator's memory and host-link facts (public data sheets)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    memory_gib: float = Field(gt=0)
    pcie_gb_per_s: float = Field(default=25.0, gt=0, description="effective host<->GPU GB/s")
    bf16_tflops: float | None = Field(default=None, gt=0)
    hbm_tb_per_s: float | None = Field(default=None, gt=0)
