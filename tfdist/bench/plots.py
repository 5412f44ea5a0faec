"""PNG figures of the multi-process benchmarks (matplotlib's object API, Agg canvas, no pyplot)."""

from __future__ import annotations

import os
from typing import Any

PART_COLORS = {"compute": "tab:blue", "exchange": "tab:orange", "input": "tab:green"}


def _figure(width: float, height: float, columns: int = 1) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(1, columns, i + 1) for i in range(columns)]


def _save(fig: Any, path: str) -> None:
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)


def plot_scaling(result: dict[str, Any], path: str) -> None:
    """Left: efficiency against workers, one line per side.

    Right: measured step parts, stacked, per worker count.

    Next to each stacked bar (compute + gradient exchange + input, measured
    apart), dots mark the measured step time of every side at that count.
    """
    fig, (eff_ax, bar_ax) = _figure(12, 4.5, columns=2)
    counts = sorted(int(n) for n in result["per_workers"])
    for name, by_count in sorted(result.get("efficiency", {}).items()):
        xs = [n for n in counts if str(n) in by_count and by_count[str(n)] is not None]
        eff_ax.plot(xs, [by_count[str(n)] for n in xs], marker="o", label=name)
    eff_ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    eff_ax.set_xticks(counts)
    eff_ax.set_xlabel("workers")
    eff_ax.set_ylabel("efficiency  T(N) / (N T(1))")
    eff_ax.set_ylim(0, 1.2)
    eff_ax.legend(fontsize=8)
    config = result.get("config", {})
    eff_ax.set_title(
        f"weak scaling, {config.get('per_worker_batch_size')} examples/worker, "
        f"{config.get('threads_per_worker')} thread(s)/worker",
        fontsize=9,
    )
    labels, x = [], 0
    for n in counts:
        entry = result["per_workers"][str(n)]
        for key, parts in sorted(entry.get("parts", {}).items()):
            bottom = 0.0
            for part, color in PART_COLORS.items():
                value = (parts.get(f"{part}_s") or 0.0) * 1e3
                bar_ax.bar(
                    x, value, bottom=bottom, color=color, width=0.6, label=part if x == 0 else None
                )
                bottom += value
            for i, (name, side) in enumerate(sorted(entry["sides"].items())):
                if side.get("step_s") is not None:
                    bar_ax.plot(
                        x + 0.35,
                        side["step_s"] * 1e3,
                        marker="o",
                        linestyle="",
                        color=f"C{(i + 3) % 10}",
                        label=f"{name} step" if x == 0 else None,
                    )
            labels.append(f"{n}w" + ("" if key == "none" else f" {key}"))
            x += 1
    bar_ax.set_xticks(range(len(labels)), labels)
    bar_ax.set_ylabel("ms per step")
    bar_ax.set_title("step split, measured apart (bars) vs whole steps (dots)", fontsize=9)
    bar_ax.legend(fontsize=7)
    _save(fig, path)


def plot_allreduce(result: dict[str, Any], path: str) -> None:
    """Bus bandwidth against message size, one line per implementation/packing/dtype.

    With the loopback limits.
    """
    fig, (ax,) = _figure(9, 5)
    for row in result.get("series", []):
        points = [(p["bytes"], p["busbw_GBps"]) for p in row["points"] if p.get("busbw_GBps")]
        if points:
            ax.plot(*zip(*points), marker=".", label=row["label"])
    for name, style in (("numpy_copy", ":"), ("tcp_loopback", "--")):
        points = [
            (p["bytes"], p["GBps"])
            for p in result.get("loopback", {}).get(name, [])
            if p.get("GBps")
        ]
        if points:
            ax.plot(*zip(*points), linestyle=style, color="black", label=f"{name} (limit)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message bytes")
    ax.set_ylabel("GB/s (all-reduce: bus bandwidth)")
    ax.set_title(
        f"all-reduce over {result.get('config', {}).get('workers')} worker processes", fontsize=9
    )
    ax.legend(fontsize=7)
    _save(fig, path)
