"""Named workload mixes from published statistics (facts quoted from the papers).

BROS Table 2 (tokens; ``sharegpt``, ``lmsys``, ``be-synthetic``):

==================  ===========  ==========  ===========  ==========
mix                 prompt mean  prompt std  output mean  output std
==================  ===========  ==========  ===========  ==========
RT-ShareGPT         222.76       256.36      234.51       268.50
RT-LMSYS-Chat-1M    90.50        148.52      237.04       228.21
BE-Synthetic        784.14       151.17      80.96        28.23
==================  ===========  ==========  ===========  ==========

Andes Table 2 (tokens; ``andes-sharegpt``, ``arxiv-summarization``, ``coding-challenges``):

=======================  ===========  ==========  ===========  ==========
dataset                  input mean   input std   output mean  output std
=======================  ===========  ==========  ===========  ==========
Multi-Round ShareGPT     3171         7943        385          300
ArXiv Summarization      17855        11401       605          153
Coding Challenges        675          1552        5423         21293
=======================  ===========  ==========  ===========  ==========

Published workloads report mean and standard deviation only; we sample lognormals matching
both moments (right-skewed, like real length distributions). Lengths are clipped to the
model's context when a run has one. BE-Synthetic follows BROS §7.1: prompt uniform in
(512, 1024), output uniform in (32, 128).

InferMax A.3 groups (``infermax-siso``, ``-silo``, ``-liso``, ``-lilo`` and mixes of two or
more joined by ``+``, e.g. ``infermax-siso+lilo``): short S = {8, 16}, long
L = {512, 1024}; each request picks one group uniformly and its I and O uniformly from the
group's sets. ``fixed-I-O`` (e.g. ``fixed-512-128``) is InferMax's fixed I/O grid point.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from sloserve.core.errors import UnknownNameError, did_you_mean
from sloserve.core.request import RequestClass
from sloserve.workloads.lengths import FixedLength, LognormalLength, UniformLength

Length = FixedLength | UniformLength | LognormalLength
Ints = NDArray[np.int64]


class LengthSampler(Protocol):
    """Anything that draws ``n`` token lengths (>= 1)."""

    def sample(self, rng: np.random.Generator, n: int) -> Ints: ...


@dataclass(frozen=True)
class Mix:
    """A named way to draw (prompt, output) lengths, and the class its requests belong to.

    ``groups`` is a list of (prompt, output) length distributions; each request draws one
    group uniformly (most mixes have one group).
    """

    name: str
    groups: tuple[tuple[LengthSampler, LengthSampler], ...]
    req_class: RequestClass
    source: str

    def sample(
        self, rng_p: np.random.Generator, rng_o: np.random.Generator, n: int
    ) -> tuple[Ints, Ints]:
        if len(self.groups) == 1:
            p, o = self.groups[0]
            return p.sample(rng_p, n), o.sample(rng_o, n)
        which = rng_p.integers(0, len(self.groups), size=n)
        prompts = np.empty(n, dtype=np.int64)
        outputs = np.empty(n, dtype=np.int64)
        for g, (p, o) in enumerate(self.groups):
            idx = np.flatnonzero(which == g)
            prompts[idx] = p.sample(rng_p, idx.size)
            outputs[idx] = o.sample(rng_o, idx.size)
        return prompts, outputs


def _one(name: str, p: Length, o: Length, cls: RequestClass, source: str) -> Mix:
    return Mix(name, ((p, o),), cls, source)


LN = LognormalLength
MIXES: dict[str, Mix] = {
    "sharegpt": _one(
        "sharegpt",
        LN(mean=222.76, std=256.36),
        LN(mean=234.51, std=268.50),
        RequestClass.RT,
        "BROS Table 2, RT-ShareGPT",
    ),
    "lmsys": _one(
        "lmsys",
        LN(mean=90.50, std=148.52),
        LN(mean=237.04, std=228.21),
        RequestClass.RT,
        "BROS Table 2, RT-LMSYS-Chat-1M",
    ),
    "be-synthetic": _one(
        "be-synthetic",
        UniformLength(low=512, high=1024),
        UniformLength(low=32, high=128),
        RequestClass.BE,
        "BROS §7.1, BE-Synthetic",
    ),
    "andes-sharegpt": _one(
        "andes-sharegpt",
        LN(mean=3171, std=7943),
        LN(mean=385, std=300),
        RequestClass.RT,
        "Andes Table 2, Multi-Round ShareGPT",
    ),
    "arxiv-summarization": _one(
        "arxiv-summarization",
        LN(mean=17855, std=11401),
        LN(mean=605, std=153),
        RequestClass.RT,
        "Andes Table 2, ArXiv Summarization",
    ),
    "coding-challenges": _one(
        "coding-challenges",
        LN(mean=675, std=1552),
        LN(mean=5423, std=21293),
        RequestClass.RT,
        "Andes Table 2, Coding Challenges",
    ),
}

_SHORT = (8, 16)
_LONG = (512, 1024)
_INFERMAX_GROUPS = {
    "siso": (_SHORT, _SHORT),
    "silo": (_SHORT, _LONG),
    "liso": (_LONG, _SHORT),
    "lilo": (_LONG, _LONG),
}


class _TwoPoint:
    """Each of two values with probability 1/2."""

    kind = "two-point"

    def __init__(self, a: int, b: int) -> None:
        self.a, self.b = a, b

    def sample(self, rng: np.random.Generator, n: int) -> Ints:
        return np.where(rng.random(n) < 0.5, self.a, self.b).astype(np.int64)


_FIXED = re.compile(r"^fixed-(\d+)-(\d+)$")
_INFERMAX = re.compile(r"^infermax-((?:siso|silo|liso|lilo)(?:\+(?:siso|silo|liso|lilo))*)$")


def mix_names() -> list[str]:
    return [*sorted(MIXES), "fixed-I-O", "infermax-siso|silo|liso|lilo[+...]"]


def get_mix(name: str) -> Mix:
    """A named mix (see the module docstring for the parameterised names)."""
    if name in MIXES:
        return MIXES[name]
    m = _FIXED.match(name)
    if m and int(m.group(1)) >= 1 and int(m.group(2)) >= 1:
        i, o = int(m.group(1)), int(m.group(2))
        return _one(
            name,
            FixedLength(value=i),
            FixedLength(value=o),
            RequestClass.RT,
            "InferMax fixed I/O grid",
        )
    m = _INFERMAX.match(name)
    if m:
        kinds = m.group(1).split("+")
        groups = tuple(
            (_TwoPoint(*_INFERMAX_GROUPS[k][0]), _TwoPoint(*_INFERMAX_GROUPS[k][1])) for k in kinds
        )
        return Mix(name, groups, RequestClass.RT, "InferMax A.3 (S={8,16}, L={512,1024})")
    raise UnknownNameError(
        f"unknown workload {name!r}{did_you_mean(name, sorted(MIXES))}; "
        f"valid: {', '.join(mix_names())}"
    )
