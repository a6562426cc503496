"""Where the prefix cache's run time goes: record every call the engine makes on the
prefix-caching KV managers of one run, then replay them and time each method.

Data: Mooncake's conversation trace (FAST '25, Apache-2.0, ``../shared/traces/``) on 16
replicas, round-robin, as ``prefix_caching.py --speed``. A replay repeats the same calls
with the same arguments on fresh managers, so two versions of ``engine/prefix_cache.py``
can be compared on identical work, alternately, without the rest of the simulation's noise:

    PYTHONPATH=src python benchmarks/prefix_replay.py --record /tmp/calls.pkl
    PYTHONPATH=src python benchmarks/prefix_replay.py --replay /tmp/calls.pkl
    PYTHONPATH=<other version>/src python benchmarks/prefix_replay.py --replay /tmp/calls.pkl

``--replay`` prints the CPU seconds of each top-level method (per call), timed with
``time.process_time`` around each call (about a microsecond of timer per call included).
Measured figures (536,031 calls; the per-unit bookkeeping before the chain segments
against them, load 2.3–2.5): all calls 1.19 → 0.99 s. Then (500,367 calls; the per-unit
key index against one key per segment, load 0.6): 0.91–0.99 → 0.82–0.93 s, ``allocate``
5.4 → 4.2 µs and ``retired`` 5.2 → 2.6 µs a call; ``docs/prefix-caching.md``, Run time.
"""

from __future__ import annotations

import argparse
import gc
import pickle
import time
from collections import defaultdict
from typing import Any

from prefix_caching import config

# Reads replayed as reads (``registering`` is an attribute, no longer a property: its read
# costs what the engine's costs).
PROPS = ("num_free_blocks", "num_cached_blocks", "registering", "num_used_blocks")
_LOG: list[tuple[int, str, Any]] = []
_MGRS: list[tuple[Any, Any]] = []


class Req:
    """What the cache reads of a request, frozen at the call."""

    __slots__ = ("hash_ids", "num_computed_tokens", "num_prompt_tokens", "req_id")

    def __init__(self, r: Any) -> None:
        self.req_id, self.hash_ids = r.req_id, r.hash_ids
        self.num_prompt_tokens = r.num_prompt_tokens
        self.num_computed_tokens = r.num_computed_tokens


def _arg(a: Any) -> Any:
    from sloserve.core.request import Request

    if isinstance(a, Request):
        return Req(a)
    if isinstance(a, list | tuple) and a and isinstance(a[0], tuple):
        return [(Req(r), n) for r, n in a]
    return list(a) if isinstance(a, list | tuple) else a


def record(path: str) -> None:
    import sloserve
    import sloserve.experiments.kv_choice as kv_choice
    from sloserve.engine.prefix_cache import PrefixCachingKVManager

    class Recording(PrefixCachingKVManager):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            self.mid, self.depth = len(_MGRS), 0
            _MGRS.append((a, k))

        def __getattribute__(self, name: str) -> Any:
            get = object.__getattribute__
            attr = get(self, name)
            if name.startswith("_") or get(self, "__dict__").get("depth", 1):
                return attr
            if name in PROPS:
                _LOG.append((get(self, "mid"), name, None))
                return attr
            if not callable(attr):
                return attr

            def call(*args: Any) -> Any:  # only calls from outside the manager
                _LOG.append((get(self, "mid"), name, tuple(map(_arg, args))))
                self.__dict__["depth"] = 1
                try:
                    return attr(*args)
                finally:
                    self.__dict__["depth"] = 0

            return call

    kv_choice.PrefixCachingKVManager = Recording  # type: ignore[misc]  (where runs build them)
    sloserve.simulate(config("round-robin", True, 0.0, 16))
    with open(path, "wb") as f:
        pickle.dump((_MGRS, _LOG), f, protocol=5)
    print(f"{len(_LOG)} calls on {len(_MGRS)} managers -> {path}")


def replay(path: str) -> None:
    from sloserve.engine.prefix_cache import PrefixCachingKVManager

    with open(path, "rb") as f:
        mgrs_args, log = pickle.load(f)
    # The log is millions of objects: frozen, the collector's passes skip it (otherwise a
    # full pass over it lands in whichever call allocates then, 0.2-0.4 s).
    gc.collect()
    gc.freeze()
    mgrs = [PrefixCachingKVManager(*a, **k) for a, k in mgrs_args]
    took: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    clock = time.process_time
    for mid, name, args in log:
        m = mgrs[mid]
        t0 = clock()
        if name in PROPS:
            getattr(m, name)
        else:
            getattr(m, name)(*args)
        took[name] += clock() - t0
        calls[name] += 1
    for name in sorted(took, key=lambda n: -took[n]):
        us = 1e6 * took[name] / calls[name]
        print(f"{name:22s} {took[name]:6.3f} s {calls[name]:8d} calls {us:6.1f} us/call")
    print(f"total {sum(took.values()):.3f} s, units evicted {sum(m.evicted_units for m in mgrs)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", metavar="FILE")
    ap.add_argument("--replay", metavar="FILE")
    a = ap.parse_args()
    if a.record:
        record(a.record)
    if a.replay:
        replay(a.replay)


if __name__ == "__main__":
    main()
