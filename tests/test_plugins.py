"""User plugins: a policy in the user's own file is usable from the CLI by name."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from cli_helpers import assert_user_error, cli_argv, write

POLICY = """
import sloserve

class Greedy(sloserve.Scheduler):
    '''Decode everything running, then admit whole prompts in arrival order while they fit.'''

    name = "plugin-greedy"
    chunked_prefill = False

    def schedule(self, view):
        kv, lim = view.kv, view.limits
        batch, tokens, free = [], 0, kv.num_free_blocks
        for r in [*view.running, *view.waiting]:
            n = r.remaining_compute
            need = kv.blocks_needed(r.req_id, n)
            if tokens + n > lim.max_batch_tokens or len(batch) >= lim.max_running or need > free:
                break
            batch.append(sloserve.ScheduledRequest(r, n))
            tokens, free = tokens + n, free - need
        return sloserve.SchedulerOutput(batch=tuple(batch))

sloserve.register_policy("plugin-greedy", lambda params: Greedy(), "a plugin's policy")
"""


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli_argv(*args), cwd=cwd, capture_output=True, text=True, env={**os.environ, **env}
    )


def test_plugin_file_module_and_env_var_all_register(tmp_path: Path) -> None:
    write(tmp_path / "my_policy.py", POLICY)
    sim = ["simulate", "--policy", "plugin-greedy", "--duration", "5", "--json"]
    by_file = _run(["--plugin", "my_policy.py", *sim], tmp_path)
    by_module = _run(["--plugin", "my_policy", *sim], tmp_path, PYTHONPATH=str(tmp_path))
    by_env = _run(sim, tmp_path, SLOSERVE_PLUGINS=str(tmp_path / "my_policy.py"))
    summaries = []
    for proc in (by_file, by_module, by_env):
        assert proc.returncode == 0, proc.stderr
        s = json.loads(proc.stdout)
        s.pop("wall_seconds")
        summaries.append(s)
    assert summaries[0]["policy"] == "plugin-greedy" and summaries[0]["finished"] > 0
    assert summaries[0] == summaries[1] == summaries[2]


def test_without_the_plugin_the_name_is_unknown(tmp_path: Path) -> None:
    proc = _run(["simulate", "--policy", "plugin-greedy", "--duration", "5"], tmp_path)
    assert_user_error(proc, "unknown policy 'plugin-greedy'")


@pytest.mark.parametrize(
    ("spec", "text", "needle"),
    [
        ("missing.py", None, "plugin 'missing.py'"),
        ("no_such_module_xyz", None, "no module named 'no_such_module_xyz'"),
        ("broken.py", "raise RuntimeError('boom')", "RuntimeError: boom"),
        ("syntax.py", "def (", "SyntaxError"),
    ],
)
def test_bad_plugins_are_one_line_errors(
    tmp_path: Path, spec: str, text: str | None, needle: str
) -> None:
    if text is not None:
        write(tmp_path / spec, text)
    proc = _run(["--plugin", spec, "policies"], tmp_path)
    assert_user_error(proc, needle)


def test_loading_twice_registers_once(tmp_path: Path) -> None:
    from sloserve.cli.plugins import load_plugins
    from sloserve.policies.registry import policy_names

    path = write(tmp_path / "twice_policy.py", POLICY.replace("plugin-greedy", "plugin-twice"))
    load_plugins([str(path), str(path)])
    load_plugins([str(path)])
    assert policy_names().count("plugin-twice") == 1


def test_plugin_entry_points_are_the_groups_entry_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``plugin_entry_points`` skips parsing every package's entry points only when no
    ``entry_points.txt`` mentions the group: with an installed package that declares one
    (a dist-info directory on the path), it finds it as ``entry_points(group=...)`` does."""
    from importlib.metadata import entry_points

    from sloserve.cli.plugins import ENTRY_POINT_GROUP, plugin_entry_points

    assert list(plugin_entry_points()) == list(entry_points(group=ENTRY_POINT_GROUP))
    info = tmp_path / "sloserve_fake_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sloserve-fake-plugin\n")
    (info / "entry_points.txt").write_text(
        f"[console_scripts]\nfake = fake:main\n\n[{ENTRY_POINT_GROUP}]\nfake = fake_mod\n"
    )
    other = tmp_path / "other_pkg-2.0.dist-info"
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: other-pkg\n")
    (other / "entry_points.txt").write_text("[console_scripts]\nother = other:main\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = list(plugin_entry_points())
    assert [(e.name, e.value, e.group) for e in found] == [("fake", "fake_mod", ENTRY_POINT_GROUP)]
    assert found == list(entry_points(group=ENTRY_POINT_GROUP))
