"""Output-length predictors: the only way a policy learns how long a request will run.

Extension point: subclass :class:`OutputLengthPredictor` and register it in
``_PREDICTORS`` (or pass an instance to the engine directly).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from sloserve.core.bounds import Tokens, check_value
from sloserve.core.errors import ConfigError, UnknownNameError
from sloserve.core.request import Request


class OutputLengthPredictor(ABC):
    """Predicts the total number of output tokens a request will generate."""

    name: str = "predictor"

    @abstractmethod
    def predict(self, req: Request) -> int:
        """Predicted total output tokens (>= 1), not the remaining ones."""

    def predict_remaining(self, req: Request) -> int:
        """Predicted tokens still to generate; at least 1 while the request is live."""
        return max(1, self.predict(req) - req.num_output_tokens)


class OraclePredictor(OutputLengthPredictor):
    """Knows the true output length: InferMax's CSP and ranking experiments assume this."""

    name = "oracle"

    def predict(self, req: Request) -> int:
        return req.true_output_len


class ConstantPredictor(OutputLengthPredictor):
    """Predicts the same length for every request, capped by the client's ``max_tokens``."""

    def __init__(self, tokens: int) -> None:
        self.tokens = check_value(Tokens, tokens, f"predictor constant:{tokens}")
        self.name = f"constant:{tokens}"

    def predict(self, req: Request) -> int:
        if req.max_tokens is not None:
            return max(1, min(self.tokens, req.max_tokens))
        return self.tokens


class MaxTokensPredictor(OutputLengthPredictor):
    """Predicts the client's ``max_tokens`` (what a real engine can reserve), else a default."""

    def __init__(self, default: int = 2048) -> None:
        self.default = check_value(Tokens, default, f"predictor max-tokens:{default}")
        self.name = f"max-tokens:{default}"

    def predict(self, req: Request) -> int:
        return req.max_tokens if req.max_tokens is not None else self.default


def _constant(arg: str | None) -> OutputLengthPredictor:
    if arg is None:
        raise ConfigError("predictor 'constant' needs a length, e.g. constant:256")
    try:
        return ConstantPredictor(int(arg))
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"predictor constant:{arg}: length must be an integer") from e


def _max_tokens(arg: str | None) -> OutputLengthPredictor:
    if not arg:
        return MaxTokensPredictor()
    try:
        return MaxTokensPredictor(int(arg))
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"predictor max-tokens:{arg}: length must be an integer") from e


_PREDICTORS: dict[str, Callable[[str | None], OutputLengthPredictor]] = {
    "oracle": lambda _arg: OraclePredictor(),
    "constant": _constant,
    "max-tokens": _max_tokens,
}


def predictor_names() -> list[str]:
    return sorted(_PREDICTORS)


def make_predictor(spec: str) -> OutputLengthPredictor:
    """Build a predictor from ``name`` or ``name:arg`` (``oracle``, ``constant:256``, ...)."""
    name, _, arg = spec.partition(":")
    factory = _PREDICTORS.get(name)
    if factory is None:
        raise UnknownNameError(f"unknown predictor {spec!r}; valid: {', '.join(predictor_names())}")
    return factory(arg or None)
