"""``sloserve reproduce all``: the five reproductions in one go, and one headline table.

Each paper's headline claims live next to its reproduction, in
``sloserve.experiments.<paper>.claims`` (a ``CLAIMS`` tuple of :class:`Claim`): the paper's
number, where our number is in that reproduction's own output file, and the "no effect"
value the claim is measured from. This module runs each reproduction through its public
entry point (``Plan.quick(seed)`` or ``Plan.full(seed)``, then ``reproduce(plan, out)``),
reads the numbers back from the files it wrote (nothing is re-derived here) and writes
``headline.json`` and ``headline.md``.

The verdict of a claim, for paper value ``p``, ours ``o`` and no-effect value ``n`` (1 for
a ratio such as "4.7× vLLM's QoE", 0 for a change such as "−71% GPUs"):

* **sign**: ``o − n`` has the sign of ``p − n`` (we see the effect the paper reports);
* **half size**: the sign holds and ``(o − n) / (p − n) >= 0.5`` (at least half the
  effect: 1.5× counts as half of 2×, since the effect of 2× is +1);
* the **ratio** column is plain ``o / p``.

A claim whose path holds ``*`` (a shell-style pattern) reads every match at that level
(e.g. every scenario of a reproduction) and keeps the one with the largest effect in the
paper's direction: the papers' claims are "up to" numbers, so ours is our best case too.
A reproduction that raises is recorded (its error, its claims "missing") and the others
still run.
"""

from __future__ import annotations

import importlib
import json
import math
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from sloserve.core.errors import ConfigError

PAPERS: tuple[str, ...] = ("andes", "qlm", "infermax", "bros", "aladdin")
"""The reproductions ``reproduce all`` runs, in this order."""


@dataclass(frozen=True)
class Claim:
    """One headline claim of a paper and where our number for it is.

    ``path`` walks the JSON file ``file`` (relative to the reproduction's output folder)
    key by key; a key with ``*`` is a pattern matching several (see the module docstring)."""

    key: str
    text: str
    paper: float
    path: tuple[str, ...]
    null: float = 0.0
    unit: str = "×"
    """How the numbers print: ``×`` (a ratio) or ``%`` (a fraction shown as a percentage)."""
    file: str = "headline.json"
    section: str = ""
    """Where the paper says it (e.g. ``§6.3``)."""

    def __post_init__(self) -> None:
        if self.paper == self.null:
            raise ValueError(f"claim {self.key}: the paper's value equals the no-effect value")
        if self.unit not in ("×", "%"):
            raise ValueError(f"claim {self.key}: unit must be × or %")


@dataclass(frozen=True)
class Verdict:
    """A claim beside our number."""

    paper: str
    claim: Claim
    ours: float | None
    note: str = ""

    @property
    def effect_share(self) -> float | None:
        """``(ours − null) / (paper − null)``: 1 is the paper's effect, 0 none."""
        if self.ours is None:
            return None
        return (self.ours - self.claim.null) / (self.claim.paper - self.claim.null)

    @property
    def ratio(self) -> float | None:
        """``ours / paper``, None when there is no number or the paper's is 0."""
        if self.ours is None or self.claim.paper == 0:
            return None
        return self.ours / self.claim.paper

    @property
    def sign(self) -> bool | None:
        share = self.effect_share
        return None if share is None else share > 0

    @property
    def half(self) -> bool | None:
        share = self.effect_share
        return None if share is None else share >= 0.5

    def row(self) -> dict[str, Any]:
        c = self.claim
        return {
            "paper": self.paper,
            "claim": c.key,
            "text": c.text,
            "section": c.section,
            "unit": c.unit,
            "paper_value": c.paper,
            "ours": self.ours,
            "no_effect": c.null,
            "ratio": self.ratio,
            "effect_share": self.effect_share,
            "sign": self.sign,
            "half_size": self.half,
            "source": "/".join((c.file, *c.path)),
            "note": self.note,
        }


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _walk(node: Any, path: tuple[str, ...]) -> list[Any]:
    if not path:
        return [node]
    if not isinstance(node, Mapping):
        return []
    head, rest = path[0], path[1:]
    if "*" in head:
        return [v for k in sorted(node) if fnmatchcase(str(k), head) for v in _walk(node[k], rest)]
    return _walk(node[head], rest) if head in node else []


def read_claim(out: Path, claim: Claim) -> tuple[float | None, str]:
    """Our number for ``claim`` from the reproduction's output folder ``out``, and a note
    saying why there is none (file missing, path missing, not a number)."""
    f = out / claim.file
    if not f.is_file():
        return None, f"{claim.file} not written"
    try:
        data = json.loads(f.read_text())
    except (OSError, json.JSONDecodeError) as e:
        return None, f"{claim.file} unreadable ({e})"
    values = [n for v in _walk(data, claim.path) if (n := _number(v)) is not None]
    if not values:
        return None, f"no number at {'/'.join(claim.path)} in {claim.file}"
    sign = 1.0 if claim.paper > claim.null else -1.0
    return max(values, key=lambda v: sign * (v - claim.null)), ""


def paper_claims(paper: str) -> tuple[Claim, ...]:
    """The headline claims defined next to ``paper``'s reproduction."""
    mod = importlib.import_module(f"sloserve.experiments.{paper}.claims")
    claims: tuple[Claim, ...] = tuple(mod.CLAIMS)
    return claims


def _run_reproduction(paper: str, out: Path, quick: bool, seed: int) -> None:
    """A reproduction through its public entry point: its plan, then ``reproduce``."""
    mod = importlib.import_module(f"sloserve.experiments.{paper}")
    plan = mod.Plan.quick(seed) if quick else mod.Plan.full(seed)
    mod.reproduce(plan, out)


Runner = Callable[[str, Path, bool, int], None]
RUNNERS: dict[str, Runner] = {p: _run_reproduction for p in PAPERS}
"""How each paper's reproduction is run (tests put small stand-ins here)."""


@dataclass
class Headline:
    """Every claim beside ours, with each reproduction's wall time and errors."""

    verdicts: list[Verdict]
    wall_s: dict[str, float]
    errors: dict[str, str] = field(default_factory=dict)
    quick: bool = False
    seed: int = 0

    @property
    def total_wall_s(self) -> float:
        return float(sum(self.wall_s.values()))

    def to_json(self) -> dict[str, Any]:
        return {
            "quick": self.quick,
            "seed": self.seed,
            "wall_s": self.wall_s,
            "total_wall_s": self.total_wall_s,
            "errors": self.errors,
            "claims": [v.row() for v in self.verdicts],
        }


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    return f"{v * 100:.1f}%" if unit == "%" else f"{v:.2f}×"


def _mark(ok: bool | None) -> str:
    return "—" if ok is None else ("yes" if ok else "no")


def markdown(h: Headline) -> str:
    """The headline table (and each reproduction's wall time and errors) as Markdown."""
    mode = "--quick" if h.quick else "full"
    lines = [
        f"# Headline claims: the papers' and ours ({mode}, seed {h.seed})",
        "",
        "Ratio is ours / paper's. *Sign*: we see the paper's effect (ours is on the same "
        "side of no effect: 1× for ratios, 0 for changes). *Half*: at least half the "
        "paper's effect.",
        "",
        "| paper | claim | paper | ours | ratio | sign | half | source |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v in h.verdicts:
        c = v.claim
        ratio = "—" if v.ratio is None else f"{v.ratio:.2f}"
        ours = _fmt(v.ours, c.unit) if v.ours is not None else f"— ({v.note})"
        where = f" ({c.section})" if c.section else ""
        lines.append(
            f"| {v.paper} | {c.text}{where} | {_fmt(c.paper, c.unit)} | {ours} | {ratio} | "
            f"{_mark(v.sign)} | {_mark(v.half)} | `{'/'.join(c.path)}` |"
        )
    lines += ["", "| reproduction | wall time (s) | status |", "|---|---|---|"]
    for p, s in h.wall_s.items():
        status = f"failed: {h.errors[p]}" if p in h.errors else "ok"
        lines.append(f"| {p} | {s:.1f} | {status} |")
    lines.append(f"| all | {h.total_wall_s:.1f} | |")
    return "\n".join(lines) + "\n"


def collect(
    out: str | Path, papers: Iterable[str] = PAPERS, *, quick: bool = False, seed: int = 0
) -> Headline:
    """The headline from reproductions already written under ``out/<paper>/`` (nothing runs;
    wall times are 0)."""
    root = Path(out)
    verdicts = []
    for p in papers:
        for c in paper_claims(p):
            ours, note = read_claim(root / p, c)
            verdicts.append(Verdict(p, c, ours, note))
    return Headline(verdicts, {p: 0.0 for p in papers}, quick=quick, seed=seed)


def _check_papers(papers: Iterable[str]) -> tuple[str, ...]:
    chosen = tuple(papers)
    unknown = [p for p in chosen if p not in PAPERS]
    if unknown or not chosen:
        raise ConfigError(
            f"papers: {', '.join(unknown) or '(none)'} not reproducible; valid: {', '.join(PAPERS)}"
        )
    return chosen


def reproduce_all(
    out: str | Path = "runs",
    *,
    quick: bool = False,
    seed: int = 0,
    papers: Iterable[str] = PAPERS,
    progress: Callable[[str, str], None] | None = None,
) -> Headline:
    """Run the papers' reproductions (each into ``out/<paper>/``), then write
    ``out/headline.json`` and ``out/headline.md``: every paper's headline claims, ours
    beside them, the ratio, and whether we reach the sign and half the size (module
    docstring). ``quick`` runs each reproduction's reduced grid. A reproduction that fails
    is recorded in ``errors`` and the rest still run. ``progress(paper, status)`` is told
    when each starts (``"running"``) and ends (``"done"`` or ``"failed"``)."""
    chosen = _check_papers(papers)
    root = Path(out)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{root}: cannot create the output folder ({e.strerror})") from e
    wall: dict[str, float] = {}
    errors: dict[str, str] = {}
    for p in chosen:
        if progress:
            progress(p, "running")
        t0 = time.perf_counter()
        try:
            RUNNERS[p](p, root / p, quick, seed)
        except Exception as e:  # one paper's failure must not lose the other four
            errors[p] = f"{type(e).__name__}: {e}".splitlines()[0]
            (root / p).mkdir(parents=True, exist_ok=True)
            (root / p / "error.txt").write_text(traceback.format_exc())
        wall[p] = time.perf_counter() - t0
        if progress:
            progress(p, "failed" if p in errors else "done")
    h = collect(root, chosen, quick=quick, seed=seed)
    h.wall_s, h.errors = wall, errors
    (root / "headline.json").write_text(json.dumps(h.to_json(), indent=2) + "\n")
    (root / "headline.md").write_text(markdown(h))
    return h
