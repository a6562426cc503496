"""Named workload mixes from published statistics (facts quoted from the papers).

BROS Table 2 reports mean and standard deviation of prompt and output lengths (tokens):

==================  ===========  ==========  ===========  ==========
mix                 prompt mean  prompt std  output mean  output std
==================  ===========  ==========  ===========  ==========
RT-ShareGPT         222.76       256.36      234.51       268.50
RT-LMSYS-Chat-1M    90.50        148.52      237.04       228.21
BE-Synthetic        784.14       151.17      80.96        28.23
==================  ===========  ==========  ===========  ==========

ShareGPT and LMSYS are sampled as lognormals matching those moments; BE-Synthetic follows
BROS §7.1: prompt uniform in (512, 1024), output uniform in (32, 128).
"""

from __future__ import annotations

from dataclasses import dataclass

from sloserve.core.errors import UnknownNameError
from sloserve.core.request import RequestClass
from sloserve.workloads.lengths import FixedLength, LognormalLength, UniformLength

Length = FixedLength | UniformLength | LognormalLength


@dataclass(frozen=True)
class Mix:
    """A named pair of length distributions and the class its requests belong to."""

    name: str
    prompt: Length
    output: Length
    req_class: RequestClass
    source: str


MIXES: dict[str, Mix] = {
    "sharegpt": Mix(
        "sharegpt",
        LognormalLength(mean=222.76, std=256.36),
        LognormalLength(mean=234.51, std=268.50),
        RequestClass.RT,
        "BROS Table 2, RT-ShareGPT",
    ),
    "lmsys": Mix(
        "lmsys",
        LognormalLength(mean=90.50, std=148.52),
        LognormalLength(mean=237.04, std=228.21),
        RequestClass.RT,
        "BROS Table 2, RT-LMSYS-Chat-1M",
    ),
    "be-synthetic": Mix(
        "be-synthetic",
        UniformLength(low=512, high=1024),
        UniformLength(low=32, high=128),
        RequestClass.BE,
        "BROS §7.1, BE-Synthetic",
    ),
}


def mix_names() -> list[str]:
    return sorted(MIXES)


def get_mix(name: str) -> Mix:
    try:
        return MIXES[name]
    except KeyError:
        raise UnknownNameError(
            f"unknown workload {name!r}; valid: {', '.join(mix_names())}"
        ) from None
