"""``sloserve reproduce all`` and :mod:`sloserve.experiments.headline`: the sign / half-size
verdicts on hand cases, reading claims from output files, and the whole command with the
reproductions replaced by stand-ins that write small known outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import sloserve
from cli_helpers import assert_user_error, run_main
from sloserve.cli import app
from sloserve.core.errors import ConfigError
from sloserve.experiments import headline as hl
from sloserve.experiments.headline import Claim, Verdict, paper_claims, read_claim


def _v(paper: float, ours: float | None, null: float) -> Verdict:
    return Verdict("p", Claim("k", "t", paper, ("x",), null=null), ours)


@pytest.mark.parametrize(
    ("paper", "ours", "null", "sign", "half"),
    [
        (4.7, 1.15, 1.0, True, False),  # Andes' quick grid: the sign, 4% of the effect
        (4.7, 2.85, 1.0, True, True),  # exactly half of +3.7
        (4.7, 2.84, 1.0, True, False),
        (4.7, 0.9, 1.0, False, False),  # the opposite effect
        (2.0, 1.5, 1.0, True, True),  # 1.5x is half of 2x (effects +0.5 and +1)
        (-0.71, -0.40, 0.0, True, True),  # a cut: -40% is 56% of -71%
        (-0.71, -0.30, 0.0, True, False),
        (-0.71, 0.10, 0.0, False, False),  # more GPUs, not fewer
        (0.742, 0.0, 0.0, False, False),  # no effect at all is not the sign
    ],
)
def test_sign_and_half_size_verdicts(
    paper: float, ours: float, null: float, sign: bool, half: bool
) -> None:
    v = _v(paper, ours, null)
    assert (v.sign, v.half) == (sign, half)
    assert v.ratio == pytest.approx(ours / paper)


def test_missing_number_has_no_verdict() -> None:
    v = _v(4.7, None, 1.0)
    assert v.sign is None and v.half is None and v.ratio is None
    with pytest.raises(ValueError, match="no-effect"):
        Claim("k", "t", 1.0, ("x",), null=1.0)


def test_read_claim_walks_the_file_and_keeps_the_best_match(tmp_path: Path) -> None:
    data = {
        "scenarios": {
            "a/b.c": {"r": 1.3, "cut": -0.2},
            "d": {"r": 2.1, "cut": -0.5},
            "e": {"r": None, "cut": "n/a"},
        }
    }
    (tmp_path / "headline.json").write_text(json.dumps(data))
    up = Claim("r", "ratio", 4.7, ("scenarios", "*", "r"), null=1.0)
    down = Claim("cut", "cut", -0.7, ("scenarios", "*", "cut"))
    assert read_claim(tmp_path, up) == (2.1, "")
    assert read_claim(tmp_path, down) == (-0.5, "")  # the largest cut, not the largest value
    one = Claim("r", "ratio", 4.7, ("scenarios", "a/b.c", "r"), null=1.0)
    assert read_claim(tmp_path, one) == (1.3, "")
    ours, note = read_claim(tmp_path, Claim("q", "q", 2.0, ("scenarios", "e", "r"), null=1.0))
    assert ours is None and "no number at scenarios/e/r" in note
    ours, note = read_claim(tmp_path / "absent", up)
    assert ours is None and note == "headline.json not written"


def test_every_paper_defines_claims_next_to_its_reproduction() -> None:
    from sloserve.experiments.andes.reproduce import PAPER as ANDES
    from sloserve.experiments.bros.reproduce import PAPER as BROS

    for p in hl.PAPERS:
        claims = paper_claims(p)
        assert claims and len({c.key for c in claims}) == len(claims)
    andes = {c.key: c.paper for c in paper_claims("andes")}
    assert all(ANDES[k] == v for k, v in andes.items())
    assert all(BROS[c.key] == c.paper for c in paper_claims("bros"))


def _concrete(path: tuple[str, ...]) -> list[str]:
    return [k.replace("*", "s1") for k in path]


def _write_outputs(out: Path, claims: tuple[Claim, ...], share: float) -> None:
    """A headline.json holding, for every claim, ``share`` of the paper's effect."""
    data: dict[str, Any] = {}
    for c in claims:
        node = data
        *keys, last = _concrete(c.path)
        for k in keys:
            node = node.setdefault(k, {})
        node[last] = c.null + share * (c.paper - c.null)
    out.mkdir(parents=True, exist_ok=True)
    (out / "headline.json").write_text(json.dumps(data))


SHARES = {"andes": 0.25, "qlm": 0.75, "infermax": 1.0, "bros": -0.5, "aladdin": 0.5}


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool, int]]:
    calls: list[tuple[str, bool, int]] = []

    def fake(paper: str, out: Path, quick: bool, seed: int) -> None:
        calls.append((paper, quick, seed))
        if paper == "qlm":
            raise RuntimeError("qlm broke\nsecond line")
        _write_outputs(out, paper_claims(paper), SHARES[paper])

    for p in hl.PAPERS:
        monkeypatch.setitem(hl.RUNNERS, p, fake)
    return calls


def test_reproduce_all_reads_each_reproductions_output(
    tmp_path: Path, stand_ins: list[tuple[str, bool, int]]
) -> None:
    h = sloserve.reproduce_all(tmp_path, quick=True, seed=3)
    assert stand_ins == [(p, True, 3) for p in hl.PAPERS]
    assert h.errors == {"qlm": "RuntimeError: qlm broke"}
    assert "RuntimeError" in (tmp_path / "qlm" / "error.txt").read_text()
    rows = json.loads((tmp_path / "headline.json").read_text())["claims"]
    assert {r["paper"] for r in rows} == set(hl.PAPERS)
    for r in rows:
        share = SHARES[r["paper"]]
        if r["paper"] == "qlm":  # failed: no numbers, no verdicts
            assert r["ours"] is None and r["sign"] is None and "not written" in r["note"]
            continue
        assert r["effect_share"] == pytest.approx(share)
        assert r["sign"] == (share > 0) and r["half_size"] == (share >= 0.5)
    md = (tmp_path / "headline.md").read_text()
    assert "| andes | mean QoE, Andes / vLLM, burst intensity sweep (max) (§6.3 Fig. 15) |" in md
    assert "470.0%" not in md and "| 4.70× | 1.93× | 0.41 | yes | no |" in md
    assert "| qlm | " in md and "failed: RuntimeError: qlm broke" in md


def test_reproduce_all_checks_its_papers(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="vidur not reproducible"):
        sloserve.reproduce_all(tmp_path, papers=["andes", "vidur"])


def test_cli_reproduce_all(tmp_path: Path, stand_ins: list[tuple[str, bool, int]]) -> None:
    res = CliRunner().invoke(
        app, ["reproduce", "all", "--quick", "--out", str(tmp_path), "--only", "andes,bros"]
    )
    assert res.exit_code == 0, res.output
    assert stand_ins == [("andes", True, 0), ("bros", True, 0)]
    assert "Headline claims" in res.output and "headline.md" in res.output
    assert json.loads((tmp_path / "headline.json").read_text())["errors"] == {}
    res = CliRunner().invoke(app, ["reproduce", "all", "--out", str(tmp_path), "--only", "qlm"])
    assert res.exit_code == 1  # a reproduction failed: written, reported, not a success


def test_cli_bad_paper_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = run_main(monkeypatch, capsys, "reproduce", "all", "--only", "andes,nope")
    assert_user_error(proc, "--only", "nope")


def test_qlm_claims_read_the_values_its_reproduction_writes(tmp_path: Path) -> None:
    """QLM's headline.json nests its numbers under ``values`` (experiments/qlm/headline.py);
    every QLM claim must find its number there (they read the top level once, and
    ``reproduce all`` showed no QLM number)."""
    from sloserve.experiments.headline import read_claim
    from sloserve.experiments.qlm.claims import CLAIMS

    values = {
        "attainment_gain_vs_naive_swap_W_A": 14.9,
        "attainment_gain_vs_naive_swap_W_B": 0.01,
        "throughput_gain_vs_naive_swap_W_A": 22.0,
        "request_throughput_gain_vs_naive_swap_W_A": 3.1,
        "warm_start_throughput_gain_W_A": 0.06,
        "warm_start_window_throughput_gain_W_A": 0.15,
        "warm_start_window_throughput_gain_W_A_large": 2.54,
        "eviction_attainment_gain_W_B": -0.009,
    }
    doc = {"paper": "qlm", "source": "", "plan": None, "claims": [], "values": values}
    (tmp_path / "headline.json").write_text(json.dumps(doc))
    got = {c.key: read_claim(tmp_path, c) for c in CLAIMS}
    assert got["attainment_gain_vs_baselines"] == (14.9, "")
    # throughput is requests served per second in the arrival window (§8.1), not tokens
    assert got["throughput_gain_vs_baselines"] == (3.1, "")
    # warm start: W_A's only; W_A_large's quick window is shorter than the 70B read (H1)
    assert got["warm_start_throughput_gain_W_A"] == (0.15, "")
    assert got["eviction_attainment_gain_W_B"] == (-0.009, "")
