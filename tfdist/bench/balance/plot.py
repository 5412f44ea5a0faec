"""The PNG of ``tfdist bench --benchmarks=balance``: step time and each worker's share over time.

Drawn as ``tfdist.bench.harness.plots`` draws the other multi-process benchmarks
(matplotlib's object API on an Agg canvas, no pyplot).
"""

from __future__ import annotations

import os
from typing import Any

COLORS = {
    "even": "tab:red",
    "balanced": "tab:blue",
    "parameter_server": "tab:green",
    "even_pair": "tab:orange",
    "balanced_pair": "tab:cyan",
    "even_latency": "tab:brown",
    "balanced_latency": "tab:purple",
}


def plot_balance(result: dict[str, Any], path: str) -> None:
    """One row per workload (``result["samples"]["workloads"]``, or ``result`` itself when it
    is one workload's).

    Left: each side's step time per epoch (its first launch) and the ideal's as a line.
    Right: each worker's share of the global batch per epoch on the balanced sides, and the
    share in proportion to the measured rates (the ideal split) as a line.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    workloads = (result.get("samples") or {}).get("workloads") or {"": result}
    fig = Figure(figsize=(12, 4.5 * len(workloads)))
    FigureCanvasAgg(fig)
    for row, (name, one) in enumerate(workloads.items()):
        step_ax = fig.add_subplot(len(workloads), 2, 2 * row + 1)
        share_ax = fig.add_subplot(len(workloads), 2, 2 * row + 2)
        _steps(one, step_ax, name)
        _shares(one, share_ax)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)


def _steps(result: dict[str, Any], step_ax: Any, workload: str) -> None:
    """Each side's step time per epoch (its first launch), the ideal's as a line."""
    sides = result.get("sides", {})
    for name, side in sides.items():
        rows = (side.get("epochs") or [[]])[0]
        step_ax.plot(
            [r["end_s"] for r in rows],
            [1e3 * r["step_s"] for r in rows],
            marker=".",
            color=COLORS.get(name),
            label=f"{name} (steady {1e3 * (side.get('step_s') or 0):.0f} ms)",
        )
    ideal = result.get("ideal", {})
    if ideal.get("step_s"):
        step_ax.axhline(1e3 * ideal["step_s"], color="black", linestyle="--", label="ideal")
    step_ax.set_xlabel("seconds into the fit")
    step_ax.set_ylabel("ms per step (epoch mean)")
    step_ax.set_ylim(bottom=0)
    step_ax.legend(fontsize=7)
    config = result.get("config", {})
    step_ax.set_title(
        f"{workload + ': ' if workload else ''}global batch {config.get('global_batch_size')}, "
        f"worker {config.get('hog_worker')} shares its core with a CPU hog",
        fontsize=9,
    )


def _shares(result: dict[str, Any], share_ax: Any) -> None:
    """Each worker's share per epoch on the balanced sides; the measured rates' as a line."""
    sides, ideal = result.get("sides", {}), result.get("ideal", {})
    config = result.get("config", {})
    global_batch = config.get("global_batch_size") or 1
    for name in ("balanced", "balanced_pair"):
        rows = (sides.get(name, {}).get("epochs") or [[]])[0]
        for label, style in (("worker:0", "-"), ("worker:1", ":")):
            share_ax.plot(
                [r["end_s"] for r in rows],
                [r["shares"].get(label, 0) / global_batch for r in rows],
                linestyle=style,
                marker=".",
                color=COLORS[name],
                label=f"{name}: {label}",
            )
    rates = ideal.get("worker_examples_per_s") or {}
    total = sum(rates.values())
    if total > 0:
        share_ax.axhline(
            rates.get("worker-1", 0) / total,
            color="grey",
            linestyle="--",
            label="worker:1 at its measured rate",
        )
    share_ax.set_ylim(0, 1)
    share_ax.set_xlabel("seconds into the fit")
    share_ax.set_ylabel("share of the global batch")
    share_ax.legend(fontsize=7)
