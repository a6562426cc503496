"""Named inference objectives: the Gateway API Inference Extension's ``InferenceObjective``.

A client (or the Kubernetes gateway in front of sloserve) names one in the
``x-gateway-inference-objective`` header; the gateway's configuration (``sloserve serve
--objectives FILE.yaml`` or :attr:`GatewaySettings.objectives
<sloserve.serve.api.GatewaySettings.objectives>`) maps the name to a priority and SLO
targets. The file is a mapping of names to objectives, at the top level or under
``objectives:``::

    objectives:
      chat:  {priority: 10, ttft_ms: 300, tpot_ms: 50}
      batch: {priority: -1}           # sheddable: dropped first under overload

``priority`` follows the Inference Extension: *higher is more important*, and below zero
the request is *sheddable*. sloserve's request priority follows vLLM (lower is served
first), so a request under an objective gets ``priority = -objective.priority``.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sloserve.core.errors import ConfigError
from sloserve.serve.schemas import MS_MAX

OBJECTIVE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
"""A Kubernetes-style object name (what an ``InferenceObjective`` is called)."""


class Objective(BaseModel):
    """One named objective: its priority (Inference Extension convention: higher is more
    important, below zero sheddable) and SLO targets in milliseconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    priority: int = Field(
        default=0, ge=-1_000_000, le=1_000_000,
        description="higher is more important; below zero the request is sheddable",
    )  # fmt: skip
    ttft_ms: float | None = Field(default=None, gt=0, le=MS_MAX, allow_inf_nan=False)
    tpot_ms: float | None = Field(default=None, gt=0, le=MS_MAX, allow_inf_nan=False)

    @property
    def sheddable(self) -> bool:
        """Dropped first (429 ``shed``) when the gateway is overloaded."""
        return self.priority < 0


def check_objective_names(objectives: dict[str, Objective]) -> dict[str, Objective]:
    """``objectives`` itself, once every name is a valid header value (else ConfigError)."""
    for name in objectives:
        if not OBJECTIVE_NAME.fullmatch(name):
            raise ConfigError(
                f"objective name {name[:60]!r} must be 1-253 letters, digits, '.', '_' or "
                "'-', starting with a letter or digit"
            )
    return objectives


def load_objectives(path: str | Path) -> dict[str, Objective]:
    """Read an objectives file (see the module docstring); ConfigError naming the file and
    the field on bad input."""
    import yaml

    from sloserve.core import yamlload

    p = Path(path)
    try:
        raw = yamlload.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{p}: cannot read the objectives file: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {str(e).splitlines()[0]}") from None
    if isinstance(raw, dict) and set(raw) == {"objectives"}:
        raw = raw["objectives"]
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{p}: expected a mapping of objective names to {{priority, ttft_ms, "
                          "tpot_ms}}")  # fmt: skip
    out: dict[str, Objective] = {}
    for name, spec in raw.items():
        try:
            out[str(name)] = Objective.model_validate(spec or {})
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(x) for x in err["loc"])
            where = f"objectives.{name}" + (f".{field}" if field else "")
            raise ConfigError(f"{p}: {where}: {err['msg']}") from None
    try:
        return check_objective_names(out)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
