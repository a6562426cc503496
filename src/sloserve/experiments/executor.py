"""Where many simulations run: one :class:`Executor` protocol, two backends.

:class:`LocalExecutor` runs tasks in local processes (``workers=1``: in this process,
serially); :class:`RayExecutor` runs the same tasks as Ray tasks, on a local Ray or on the
cluster ``RAY_ADDRESS`` names (``ray`` is imported only when this backend is built: the
``ray`` extra). :func:`make_executor` picks one by name (``None``: ``ray`` when
``RAY_ADDRESS`` is set, else ``local``); :func:`register_executor` adds a backend.

Results do not depend on the backend: every task is a pure function of its input (each
simulation seeds its own random streams), and results come back in input order whatever
order they finished in.

**Rounds** (for searches that decide what to run next from what just ran, like a
bisection over the arrival rate or the replica count)::

    with make_executor("local", workers=4) as ex:
        lo, hi = 0.5, 64.0
        while hi / lo > 1.05:
            probes = [lo * (hi / lo) ** (k / 4) for k in (1, 2, 3)]
            ok = ex.wait(ex.submit_round(meets_slo, probes))   # one round, in parallel
            lo = max([lo] + [p for p, good in zip(probes, ok) if good])
            hi = min([hi] + [p for p, good in zip(probes, ok) if not good])

:meth:`Executor.submit_round` starts every task of a round at once and returns a
:class:`Round` of handles without waiting; :meth:`Executor.wait` blocks until all of them
are done and returns their results in submission order (``on_done(index, result)`` is
called as each finishes, in completion order, for progress bars and partial writes). A
task's exception is raised by ``wait``: the lowest-index failure, so that the error does
not depend on timing (tasks after it are cancelled, those before it finish first). Several
rounds may be in flight at once. :meth:`Executor.map` is ``wait(submit_round(...))``.

Functions and items must be picklable (module-level functions, plain data) for the
process and Ray backends.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from sloserve.core.errors import ConfigError

A = TypeVar("A")
R = TypeVar("R")

OnDone = Callable[[int, Any], None]
"""Called as ``on_done(index, result)`` when task ``index`` of a round finishes."""


@dataclass
class Round(Generic[R]):
    """The handles of one submitted round, in submission (input) order.

    ``handles`` are backend objects (a ``concurrent.futures.Future``, a Ray ``ObjectRef``,
    or a deferred call for in-process execution); pass the round to the executor's
    :meth:`~Executor.wait`."""

    handles: list[Any]
    executor: Executor = field(repr=False)

    def __len__(self) -> int:
        return len(self.handles)


@runtime_checkable
class Executor(Protocol):
    """Runs independent tasks ``fn(item)`` and hands back their results in input order.

    Implementations: :class:`LocalExecutor`, :class:`RayExecutor`; add one with
    :func:`register_executor`. Use as a context manager (or call :meth:`close`) so that
    worker processes are released."""

    name: str
    workers: int

    def submit_round(
        self,
        fn: Callable[[A], R],
        items: Sequence[A],
        *,
        cost: Callable[[A], float] | None = None,
    ) -> Round[R]:
        """Start ``fn(item)`` for every item without waiting (``cost``: submit the most
        costly first, so that no worker is left alone with a long task at the end)."""
        ...

    def wait(self, round_: Round[R], *, on_done: OnDone | None = None) -> list[R]:
        """Block until the round is done; its results in submission order."""
        ...

    def map(
        self,
        fn: Callable[[A], R],
        items: Sequence[A],
        *,
        on_done: OnDone | None = None,
        cost: Callable[[A], float] | None = None,
    ) -> list[R]:
        """``fn`` over ``items`` in parallel; results in input order."""
        ...

    def close(self) -> None:
        """Release workers (idempotent)."""
        ...

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc: object) -> None: ...


def _order(items: Sequence[Any], cost: Callable[[Any], float] | None) -> list[int]:
    idx = list(range(len(items)))
    if cost is not None:
        idx.sort(key=lambda k: -cost(items[k]))  # stable: ties keep input order
    return idx


class _Base:
    """What both backends share: ``map`` on top of ``submit_round``/``wait``, and the
    context manager."""

    name = "base"
    workers = 1

    def submit_round(
        self,
        fn: Callable[[A], R],
        items: Sequence[A],
        *,
        cost: Callable[[A], float] | None = None,
    ) -> Round[R]:
        raise NotImplementedError

    def wait(self, round_: Round[R], *, on_done: OnDone | None = None) -> list[R]:
        raise NotImplementedError

    def map(
        self,
        fn: Callable[[A], R],
        items: Sequence[A],
        *,
        on_done: OnDone | None = None,
        cost: Callable[[A], float] | None = None,
    ) -> list[R]:
        return self.wait(self.submit_round(fn, items, cost=cost), on_done=on_done)

    def close(self) -> None:
        return None

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self, round_: Round[Any]) -> None:
        if round_.executor is not self:
            raise ValueError("this round was submitted to another executor")


@dataclass
class _Deferred:
    """An in-process task, run when its round is waited for."""

    fn: Callable[[Any], Any]
    item: Any


class LocalExecutor(_Base):
    """Local processes (``workers``, default: the machine's cores); ``workers=1`` runs every
    task in this process, serially, in input order (no pickling: handy under a debugger).
    A round of one task also runs in process. The process pool starts with the first
    parallel round and is reused until :meth:`close`."""

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        if workers is not None and workers < 1:
            raise ConfigError(f"workers must be >= 1, got {workers}")
        self.workers = workers or max(1, os.cpu_count() or 1)
        self._pool: ProcessPoolExecutor | None = None

    def submit_round(
        self,
        fn: Callable[[A], R],
        items: Sequence[A],
        *,
        cost: Callable[[A], float] | None = None,
    ) -> Round[R]:
        if self.workers == 1 or len(items) <= 1:
            return Round([_Deferred(fn, it) for it in items], self)
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers)
        handles: list[Any] = [None] * len(items)
        for k in _order(items, cost):
            handles[k] = self._pool.submit(fn, items[k])
        return Round(handles, self)

    def wait(self, round_: Round[R], *, on_done: OnDone | None = None) -> list[R]:
        self._check(round_)
        out: list[Any] = [None] * len(round_)
        if all(isinstance(h, _Deferred) for h in round_.handles):
            for k, h in enumerate(round_.handles):
                out[k] = h.fn(h.item)
                if on_done:
                    on_done(k, out[k])
            return out
        index = {id(f): k for k, f in enumerate(round_.handles)}
        pending: set[Future[Any]] = set(round_.handles)
        failed: list[tuple[int, BaseException]] = []
        while pending:
            done, pending = wait_futures(pending, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=lambda f: index[id(f)]):
                k = index[id(f)]
                if f.cancelled():
                    continue
                exc = f.exception()
                if exc is not None:
                    failed.append((k, exc))
                    continue
                out[k] = f.result()
                if on_done and not failed:
                    on_done(k, out[k])
            if failed:
                # tasks after the first failure are dropped; those before it still run, so
                # that the error raised is the lowest-index one whatever the timing
                first = min(k for k, _ in failed)
                for f in pending:
                    if index[id(f)] > first:
                        f.cancel()
                pending = {f for f in pending if index[id(f)] < first}
        if failed:
            raise min(failed, key=lambda t: t[0])[1]
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class RayExecutor(_Base):
    """Ray tasks on the cluster at ``address`` (default: ``$RAY_ADDRESS``), or on a local
    Ray started with ``workers`` CPUs (default: the machine's cores) when neither is set.
    An already initialised Ray (``ray.init`` called by the user) is used as it is.

    On a real cluster the workers must import the same ``sloserve`` (install it there, or
    pass ``runtime_env={"pip": [...]}``/``{"py_modules": [...]}``); each task asks for
    one CPU."""

    name = "ray"

    def __init__(
        self,
        workers: int | None = None,
        *,
        address: str | None = None,
        runtime_env: dict[str, Any] | None = None,
    ) -> None:
        if workers is not None and workers < 1:
            raise ConfigError(f"workers must be >= 1, got {workers}")
        try:
            import ray
        except ImportError:
            raise ConfigError(
                "the ray executor needs Ray: pip install 'sloserve[ray]' (or 'ray>=2.20')"
            ) from None
        self._ray: Any = ray  # Ray's API is only partly typed
        self._remote: dict[Callable[..., Any], Any] = {}
        address = address or os.environ.get("RAY_ADDRESS") or None
        if not self._ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if runtime_env is not None:
                kwargs["runtime_env"] = runtime_env
            if address is not None:
                self._ray.init(address=address, **kwargs)
            else:
                kwargs["num_cpus"] = workers or max(1, os.cpu_count() or 1)
                self._ray.init(**kwargs)
        self.workers = workers or int(self._ray.cluster_resources().get("CPU", 1))

    def _as_remote(self, fn: Callable[..., Any]) -> Any:
        if fn not in self._remote:
            self._remote[fn] = self._ray.remote(num_cpus=1)(fn)
        return self._remote[fn]

    def submit_round(
        self,
        fn: Callable[[A], R],
        items: Sequence[A],
        *,
        cost: Callable[[A], float] | None = None,
    ) -> Round[R]:
        remote = self._as_remote(fn)
        handles: list[Any] = [None] * len(items)
        for k in _order(items, cost):
            handles[k] = remote.remote(items[k])
        return Round(handles, self)

    def wait(self, round_: Round[R], *, on_done: OnDone | None = None) -> list[R]:
        self._check(round_)
        ray = self._ray
        out: list[Any] = [None] * len(round_)
        index = {ref: k for k, ref in enumerate(round_.handles)}
        pending = list(round_.handles)
        failed: list[tuple[int, BaseException]] = []
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                k = index[ref]
                try:
                    out[k] = ray.get(ref)
                except Exception as e:
                    # a task's own error: Ray wraps it (with the remote traceback in its
                    # text); hand back the original so that callers see the same error
                    # whichever backend ran the task
                    cause = getattr(e, "cause", None)
                    failed.append((k, cause if isinstance(cause, BaseException) else e))
                    continue
                if on_done and not failed:
                    on_done(k, out[k])
            if failed:  # as in LocalExecutor.wait: finish the tasks before the failure
                first = min(k for k, _ in failed)
                for ref in pending:
                    if index[ref] > first:
                        ray.cancel(ref)
                pending = [ref for ref in pending if index[ref] < first]
        if failed:
            raise min(failed, key=lambda t: t[0])[1]
        return out


ExecutorFactory = Callable[[int | None], Executor]

_REGISTRY: dict[str, ExecutorFactory] = {
    "local": LocalExecutor,
    "ray": RayExecutor,
}


def register_executor(name: str, factory: ExecutorFactory) -> None:
    """Make ``make_executor(name, workers)`` build ``factory(workers)``."""
    _REGISTRY[name] = factory


def executor_names() -> list[str]:
    return sorted(_REGISTRY)


def default_executor_name() -> str:
    """``ray`` when ``RAY_ADDRESS`` is set (a Ray cluster is there to use), else ``local``."""
    return "ray" if os.environ.get("RAY_ADDRESS") else "local"


def make_executor(name: str | None = None, workers: int | None = None) -> Executor:
    """The executor called ``name`` (default: :func:`default_executor_name`) with
    ``workers`` workers; an unknown name is a :class:`ConfigError` listing the valid ones."""
    key = default_executor_name() if name is None else name
    factory = _REGISTRY.get(key)
    if factory is None:
        raise ConfigError(f"unknown executor {key!r}; valid: {', '.join(executor_names())}")
    return factory(workers)


def as_executor(executor: Executor | str | None, workers: int | None) -> tuple[Executor, bool]:
    """``executor`` itself, or a new one made by name; the flag says whether the caller
    made it (and so must close it)."""
    if executor is None or isinstance(executor, str):
        return make_executor(executor, workers), True
    return executor, False
