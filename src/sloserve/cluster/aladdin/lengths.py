"""Aladdin §2.3 and §4.3: output-length prediction from the workload's history.

The prediction for a prompt of ``l_in`` tokens is the mean output length of the history's
requests whose prompt fell in the same bin (Aladdin uses "the estimated output length of
each input length in the historical data"). When a request outlives its prediction, the
re-prediction is the conditional mean of the bin's outputs longer than what it has
generated so far (§4.3: "conditional average output length when l_real > l_pred").

Choices: bins are ``bins`` (8) quantiles of the history's prompt lengths, so each bin
holds the same number of requests; a bin's mean is rounded up to a whole token; with no
longer output in the bin the re-prediction is the tokens generated so far plus one.
:class:`OracleLengths` knows the true length (the ``--oracle-lengths`` ablation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sloserve.core.errors import ConfigError

IntsLike = Sequence[int] | np.ndarray


class LengthPredictor:
    """Conditional-mean output length given the prompt length (module docstring)."""

    oracle = False

    def __init__(self, prompts: IntsLike, outputs: IntsLike, bins: int = 8) -> None:
        p = np.asarray(prompts, dtype=np.int64)
        o = np.asarray(outputs, dtype=np.int64)
        if len(p) == 0 or len(p) != len(o):
            raise ConfigError("length history: prompts and outputs must be equal, non-empty")
        if bins < 1:
            raise ConfigError(f"length history: bins {bins} must be >= 1")
        self.edges = np.unique(np.quantile(p, np.linspace(0, 1, bins + 1)[1:-1]))
        which = np.searchsorted(self.edges, p, side="right")
        self._outputs = [np.sort(o[which == b]) for b in range(len(self.edges) + 1)]
        overall = np.sort(o)
        self._outputs = [x if len(x) else overall for x in self._outputs]
        self._means = [math.ceil(float(x.mean())) for x in self._outputs]
        # Mean of each bin's outputs from index i on: a re-prediction is a lookup.
        self._tail_means = [
            np.cumsum(x[::-1])[::-1] / np.arange(len(x), 0, -1) for x in self._outputs
        ]
        self.mean_prompt = float(p.mean())
        self.mean_output = float(o.mean())

    def _bin(self, prompt: int) -> int:
        return int(np.searchsorted(self.edges, prompt, side="right"))

    def predict(self, prompt: int, true_output: int | None = None) -> int:
        """Predicted total output tokens of a prompt of ``prompt`` tokens."""
        return max(1, self._means[self._bin(prompt)])

    def repredict(self, prompt: int, generated: int, true_output: int | None = None) -> int:
        """The mean of the bin's outputs longer than ``generated`` (module docstring)."""
        b = self._bin(prompt)
        i = int(np.searchsorted(self._outputs[b], generated, side="right"))
        tail = self._tail_means[b]
        return math.ceil(float(tail[i])) if i < len(tail) else generated + 1


class OracleLengths(LengthPredictor):
    """Knows each request's true output length (ablation)."""

    oracle = True

    def predict(self, prompt: int, true_output: int | None = None) -> int:
        if true_output is None:
            raise ConfigError("oracle lengths: the request's true output length is unknown")
        return max(1, true_output)

    def repredict(self, prompt: int, generated: int, true_output: int | None = None) -> int:
        return max(generated + 1, self.predict(prompt, true_output))


def history(mix: str, n: int = 20_000, seed: int = 12345) -> tuple[np.ndarray, np.ndarray]:
    """``n`` (prompt, output) lengths of the named mix, drawn with their own ``seed`` (the
    "historical data" every Aladdin estimate learns from, apart from the run's requests)."""
    from sloserve.workloads.mixes import get_mix

    rng = np.random.default_rng(seed)
    p, o = get_mix(mix).sample(rng, rng, n)
    return np.maximum(p, 1), np.maximum(o, 1)


def mean_kv_demand(prompts: np.ndarray, outputs: np.ndarray) -> float:
    """m_r: the time-average KV tokens of a request, mean of ``l_in + l_out/2``."""
    return float(np.mean(prompts + outputs / 2.0))
