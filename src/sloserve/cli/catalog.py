"""CLI commands: ``policies``, ``routers`` and ``profiles`` (registered by ``sloserve.cli``).

The catalogs a user picks from: the scheduling policies, the cluster routers and the
built-in replica profiles.
"""

from __future__ import annotations

from sloserve.cli._app import app, console
from sloserve.cli._console import new_table


@app.command("policies")
def list_policies() -> None:
    """List the scheduling policies."""
    from sloserve.policies.registry import policy_summaries

    t = new_table("policy", "what it is")
    t.columns[0].no_wrap = True
    for name, summary in policy_summaries().items():
        t.add_row(name, summary)
    console.print(t)


@app.command("routers")
def list_routers() -> None:
    """List the cluster routers (for --router / --routers and cluster.router)."""
    from sloserve.cluster.routing import router_summaries

    t = new_table("router", "how it picks")
    t.columns[0].no_wrap = True
    for name, summary in router_summaries().items():
        t.add_row(name, summary)
    console.print(t)


@app.command("profiles")
def list_profiles() -> None:
    """List the built-in replica profiles with their KV capacity at 0.9 utilisation."""
    from sloserve.costmodel.profile import load_profile, profile_names

    t = new_table("profile", "model", "GPU", "TP", "M (tokens)", "decode 1 / 32 req (ms)")
    t.columns[0].no_wrap = True
    for col in t.columns[1:]:
        col.overflow = "fold"
    for name in profile_names():
        p = load_profile(name)
        cm = p.cost_model()
        t.add_row(
            name,
            p.model.name,
            p.gpu.name,
            str(p.tp),
            f"{p.kv_capacity_tokens(0.9):,}",
            f"{cm.decode_time(1, 1024) * 1e3:.1f} / {cm.decode_time(32, 32 * 1024) * 1e3:.1f}",
        )
    console.print(t)
