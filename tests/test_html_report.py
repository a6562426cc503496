"""report.html: self-contained, deterministic, and it renders in a real headless browser
(Chromium; skipped where none is installed: `apt-get install chromium`)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sloserve.cluster import ClusterConfig
from sloserve.experiments.cluster_run import simulate_cluster
from sloserve.experiments.html_report import render_html, report_data
from sloserve.experiments.report import write_report
from sloserve.experiments.runner import InstanceConfig, SimConfig, compare
from sloserve.workloads import PoissonArrivals, WorkloadSpec

CFG = SimConfig(
    workload=WorkloadSpec(arrival=PoissonArrivals(rate=4), duration_s=10, seed=5),
    instance=InstanceConfig(kv_capacity_tokens=4000),
)
BROWSER = next(
    (b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None
)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rep")
    write_report(compare(CFG, ["vllm", "sarathi"]), out)
    return out / "report.html"


def test_report_html_is_self_contained_and_deterministic(report: Path) -> None:
    text = report.read_text()
    assert report.parent.joinpath("cdf_ttft.png").exists()  # beside the PNGs
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)  # no network
    assert "<script src" not in text and "@import" not in text
    assert text.count("<tr>") == 1 + 2  # header + one row per policy
    res = compare(CFG, ["vllm", "sarathi"])
    assert render_html(res) == text  # same inputs, same bytes


def test_report_data_series() -> None:
    cc = ClusterConfig(replicas=[{"count": 2}], router="round-robin")
    res = {"cluster": simulate_cluster(CFG, cc)}
    d = report_data(res)
    assert [s["name"] for s in d["timeline"]["running"]] == [
        "cluster · replica 0",
        "cluster · replica 1",
    ]
    ttft = d["cdfs"]["ttft"][0]
    assert ttft["y"][-1] == 1.0 and ttft["x"] == sorted(ttft["x"])
    assert len(ttft["x"]) == res["cluster"].table["ttft_s"].notna().sum()


@pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (apt-get install chromium)")
def test_report_renders_in_headless_chromium(report: Path) -> None:
    assert BROWSER is not None
    proc = subprocess.run(
        [
            BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
            "--v=0", "--dump-dom", report.as_uri(),
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert 'data-plots="6"' in dom  # the script ran to its end: 3 CDFs + 3 timelines
    # one drawn path per series: 2 runs x 3 CDFs + 2 runs x 3 timelines
    paths = re.findall(r'<path d="M[^"]+"[^>]*class="series"', dom)
    assert len(paths) == 12, len(paths)
    assert all(len(p) > 40 for p in paths)  # real curves, not empty placeholders
    assert dom.count('class="legend"') == 6
    assert "Uncaught" not in proc.stderr, proc.stderr[-2000:]
    assert not re.search(r"CONSOLE.*(Error|error)", proc.stderr), proc.stderr[-2000:]
