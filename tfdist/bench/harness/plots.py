"""PNG figures of the multi-process benchmarks (matplotlib's object API, Agg canvas, no pyplot)."""

from __future__ import annotations

import os
from typing import Any

PART_COLORS = {"compute": "tab:blue", "exchange": "tab:orange", "input": "tab:green"}


def _figure(width: float, height: float, columns: int = 1, rows: int = 1) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(rows, columns, i + 1) for i in range(rows * columns)]


def _top(values: Any, floor: float = 1.2) -> float:
    """An axis's upper limit that holds every value (and ``floor``), with a margin."""
    finite = [v for v in values if v is not None and v == v]
    return max([floor, *(1.1 * v for v in finite)])


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
    eff_ax.set_ylim(0, _top(v for by in result.get("efficiency", {}).values() for v in by.values()))
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


def plot_stragglers(result: dict[str, Any], path: str) -> None:
    """Left: examples/s, balanced and with a straggler, per strategy.

    Right: straggler / balanced per strategy, with the fully synchronous (1 / factor) and the
    independent-workers references as lines.
    """
    fig, (rate_ax, ratio_ax) = _figure(11, 4.2, columns=2)
    names = [n for n in ("multi_worker", "parameter_server") if f"{n}_examples_per_s" in result]
    for offset, (side, color) in enumerate((("balanced", "tab:blue"), ("straggler", "tab:red"))):
        values = [result[f"{n}_examples_per_s"][side] or 0.0 for n in names]
        xs = [i + (offset - 0.5) * 0.38 for i in range(len(names))]
        rate_ax.bar(xs, values, width=0.36, color=color, label=side)
    rate_ax.set_xticks(range(len(names)), names)
    rate_ax.set_ylabel("examples/s (median)")
    rate_ax.legend(fontsize=8)
    config = result.get("config", {})
    injected = result.get("injected", {})
    delays = ", ".join(
        f"{n}: {1e3 * (injected.get(n, {}).get('seconds_per_batch') or 0.0):.1f} ms" for n in names
    )
    rate_ax.set_title(
        f"worker {config.get('straggler')} slowed x{config.get('factor')} ({delays} per batch)",
        fontsize=9,
    )
    ratios = [result.get(f"{n}_ratio") or 0.0 for n in names]
    ratio_ax.bar(range(len(names)), ratios, width=0.5, color="tab:purple")
    for x, value in enumerate(ratios):
        ratio_ax.text(x, value, f"{value:.2f}", ha="center", va="bottom")
    for x, name in enumerate(names):  # what the sleep actually injected predicts
        expected = result.get(f"{name}_expected_ratio")
        if expected is not None:
            ratio_ax.plot(
                [x - 0.3, x + 0.3],
                [expected] * 2,
                color="black",
                linewidth=2,
                label="expected from the effective factor" if x == 0 else None,
            )
    for key, style, label in (
        ("expected_sync_ratio", "--", "1 / factor (waits for the slowest)"),
        ("expected_independent_ratio", ":", "independent workers"),
    ):
        if result.get(key) is not None:
            ratio_ax.axhline(result[key], color="grey", linestyle=style, label=label)
    ratio_ax.set_xticks(range(len(names)), names)
    ratio_ax.set_ylim(0, _top(ratios))
    ratio_ax.set_ylabel("examples/s with straggler / balanced")
    ratio_ax.legend(fontsize=8, loc="lower right")
    _save(fig, path)


def plot_health(result: dict[str, Any], path: str) -> None:
    """Left: examples/s per side (median, with every sample as a dot).

    Right: the per-round ratios on / off and on_fast / off, their medians, and the 1% goal.
    """
    fig, (rate_ax, ratio_ax) = _figure(10, 4, columns=2)
    names = [n for n in ("off", "on", "on_fast") if n in result.get("sides", {})]
    colors = {"off": "tab:grey", "on": "tab:blue", "on_fast": "tab:orange"}
    for x, name in enumerate(names):
        side = result["sides"][name]
        rate_ax.bar(x, side.get("examples_per_s") or 0.0, width=0.6, color=colors[name])
        samples = side.get("examples_per_s_samples", [])
        rate_ax.plot([x] * len(samples), samples, "k.", markersize=4)
    rate_ax.set_xticks(range(len(names)), names)
    rate_ax.set_ylabel("examples/s (median; dots: each measurement)")
    config = result.get("config", {})
    rate_ax.set_title(
        f"{config.get('workers')} MWMS workers, {config.get('steps')} steps per measurement, "
        f"{config.get('threads_per_worker')} thread(s)/worker",
        fontsize=9,
    )
    for x, key in enumerate(("paired_samples", "on_fast_paired_samples")):
        samples = result.get(key) or []
        ratio_ax.plot([x] * len(samples), samples, "k.", markersize=5)
        median = result.get(key.replace("_samples", "_ratio"))
        if median is not None:
            ratio_ax.plot([x - 0.25, x + 0.25], [median] * 2, color="tab:purple", linewidth=2)
            ratio_ax.text(x + 0.28, median, f"{median:.3f}", va="center", fontsize=8)
    ratio_ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ratio_ax.axhline(0.99, color="tab:red", linewidth=1, label="goal: >= 0.99")
    ratio_ax.set_xticks([0, 1], ["on / off", "on_fast / off"])
    ratio_ax.set_xlim(-0.6, 1.8)
    ratio_ax.set_ylabel("examples/s ratio within each round")
    ratio_ax.legend(fontsize=8)
    _save(fig, path)


# time_to_accuracy: colour per launch, line style and marker per LR rule (or split).
TTA_COLORS = {"1": "tab:blue", "2": "tab:orange", "2_uneven": "tab:green"}
TTA_STYLES = {"none": ("-", "."), "linear": ("--", "^"), "even": ("--", "^")}
TTA_STYLES["balanced"] = ("-", "s")
TTA_NAMES = {"1": "1 worker", "2": "2 workers", "2_uneven": "2 workers, a hog on worker 1"}
TTA_NAMES.update(none="no scaling", linear="linear scaling + warmup")
TTA_NAMES.update(even="linear scaling, even split", balanced="linear scaling, balanced")


def _tta_runs(task: dict[str, Any]) -> Any:
    """Yields ``(workers, rule, repeat index, run)`` for every fit of a time_to_accuracy task."""
    for n, entry in sorted(task.get("per_workers", {}).items()):
        for rule, side in entry.get("sides", {}).items():
            for i, run in enumerate(side.get("runs", [])):
                yield n, rule, i, run


def _draw_tta_curve(time_ax: Any, epoch_ax: Any, n: str, rule: str, i: int, run: Any) -> None:
    """One fit's accuracy per epoch against seconds and epochs; a circle where it hit the target."""
    curve = run.get("curve", [])
    linestyle, marker = TTA_STYLES.get(rule, (":", "."))
    style = {
        "linestyle": linestyle,
        "marker": marker,
        "color": TTA_COLORS.get(n, "tab:grey"),
        "alpha": 1.0 if i == 0 else 0.35,
        "label": f"{TTA_NAMES.get(n, n)}, {TTA_NAMES.get(rule, rule)}" if i == 0 else None,
    }
    accuracy = [p["val_accuracy"] for p in curve]
    time_ax.plot([p["seconds"] for p in curve], accuracy, **style)
    epoch_ax.plot([p["epoch"] for p in curve], accuracy, **style)
    if run.get("reached"):
        time_ax.plot(
            run["seconds_to_target"],
            accuracy[run["epochs_to_target"] - 1],
            "o",
            markerfacecolor="none",
            color=style["color"],
            markersize=9,
        )


def _draw_tta_task(time_ax: Any, epoch_ax: Any, name: str, task: dict[str, Any], lr: Any) -> None:
    """One benchmark task's row: every fit against seconds (left) and epochs (right)."""
    config = task.get("config", {})
    target = config.get("target_accuracy")
    lowest = 1.0
    for n, rule, i, run in _tta_runs(task):
        _draw_tta_curve(time_ax, epoch_ax, n, rule, i, run)
        lowest = min([lowest, *(p["val_accuracy"] for p in run.get("curve", []))])
    for ax in (time_ax, epoch_ax):
        if target is not None:
            ax.axhline(target, color="tab:red", linewidth=1, label=f"target {target}")
        ax.set_ylabel("validation accuracy")
        ax.set_ylim(max(0.0, lowest - 0.05), 1.01)
    time_ax.set_xlabel("seconds since fit was called (validation excluded)")
    epoch_ax.set_xlabel("epochs (the same examples on every side)")
    epoch_ax.xaxis.get_major_locator().set_params(integer=True)
    time_ax.set_title(
        f"{name}: {config.get('model')} on {config.get('dataset')}, "
        f"{config.get('per_worker_batch_size')} examples/worker/step, lr={lr}",
        fontsize=9,
    )
    time_ax.legend(fontsize=7, loc="lower right")


def plot_time_to_accuracy(result: dict[str, Any], path: str) -> None:
    """Per task, validation accuracy against training seconds (left) and epochs (right).

    Colour: the worker count; line style: the LR rule; every repeat drawn (the first one solid).
    The target is the red line; a circle marks where each fit first reached it.
    """
    tasks = result.get("tasks", {})
    fig, axes = _figure(12, 4.5 * max(1, len(tasks)), columns=2, rows=max(1, len(tasks)))
    config = result.get("config", {})
    for row, (name, task) in enumerate(tasks.items()):
        time_ax, epoch_ax = axes[2 * row], axes[2 * row + 1]
        _draw_tta_task(time_ax, epoch_ax, name, task, config.get("learning_rate"))
        epoch_ax.set_title(
            f"1 worker: one_device; 2 workers: multi_worker (loopback); "
            f"{config.get('optimizer')}, {config.get('threads_per_worker')} thread(s)/worker",
            fontsize=9,
        )
    _save(fig, path)


# memory: the replica's bytes by kind, stacked; the allocator and RSS per worker; examples/s.
MEMORY_KINDS = {
    "parameters": "tab:blue",
    "optimizer_state": "tab:orange",
    "gradients": "tab:green",
    "master_shards": "tab:purple",
}
MEMORY_READINGS = (
    ("allocator_current", "allocator, after the steps"),
    ("allocator_peak", "allocator peak, whole run"),
    ("rss_peak", "peak RSS"),
)


def plot_memory(result: dict[str, Any], path: str) -> None:
    """Per workload, worker count and mode: left, the bytes a replica holds by kind (from the
    shapes); middle, the TF allocator's current and peak and the peak RSS of the worker with
    the most; right, examples/s (the median over the quiet fits, or over all when none was)."""
    fig, (held_ax, mem_ax, rate_ax) = _figure(15, 4.8, columns=3)
    workloads = result.get("workloads", {})
    launches = [
        (f"{workload} {n}w {mode}", entry)
        for workload, one in workloads.items()
        for n, entries in sorted(one.get("per_workers", {}).items(), key=lambda i: int(i[0]))
        for mode, entry in entries.items()
    ]
    labels = [label for label, _ in launches]
    mib = float(1 << 20)
    for x, (_, entry) in enumerate(launches):
        bottom = 0.0
        for kind, color in MEMORY_KINDS.items():
            value = (entry.get("replica_bytes") or {}).get(kind, 0) / mib
            held_ax.bar(x, value, bottom=bottom, color=color, label=kind if x == 0 else None)
            bottom += value
        for i, (key, words) in enumerate(MEMORY_READINGS):
            value = (entry["worst_worker"].get(key) or 0) / mib
            mem_ax.bar(
                x + (i - 1) * 0.27,
                value,
                width=0.25,
                color=f"C{i}",
                label=words if x == 0 else None,
            )
        rate = entry.get("quiet_examples_per_s") or entry.get("examples_per_s") or 0.0
        rate_ax.bar(x, rate, color="tab:grey")
    for ax, ylabel in (
        (held_ax, "MiB per replica, from the variables' shapes"),
        (mem_ax, "MiB, the worker with the most"),
        (rate_ax, "examples/s, all workers (median, quiet fits)"),
    ):
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
    held_ax.legend(fontsize=7)
    mem_ax.legend(fontsize=7)
    config = result.get("config", {})
    sizes = ", ".join(f"{w} {one.get('parameters', 0) / 1e6:.1f}M" for w, one in workloads.items())
    held_ax.set_title(f"parameters: {sizes}; Adam, multi_worker", fontsize=9)
    mem_ax.set_title("TF CPU allocator and RSS per worker", fontsize=9)
    rate_ax.set_title(f"{config.get('threads_per_worker')} thread(s)/worker", fontsize=9)
    _save(fig, path)


def plot_pipeline(result: dict[str, Any], path: str) -> None:
    """Against micro-batches M: left, examples/s of the pipeline and of one device (medians,
    dots: every fit); right, the bubble computed, from the profile and from step times."""
    fig, (rate_ax, bubble_ax) = _figure(11, 4.2, columns=2)
    entries = sorted(result.get("per_micro_batches", {}).items(), key=lambda i: int(i[0]))
    ms = [int(m) for m, _ in entries]
    colors = {"pipeline": "tab:blue", "one_device": "tab:grey", "one_device_threads": "tab:green"}
    for side, color in colors.items():
        rate_ax.plot(
            ms,
            [e["sides"][side]["examples_per_s"] for _, e in entries],
            "o-",
            color=color,
            label=side,
        )
        for m, (_, e) in zip(ms, entries):
            values = e.get("samples", {}).get("values", {}).get(side, [])
            rate_ax.plot([m] * len(values), values, ".", color=color, alpha=0.5)
    for key, style, label in (
        ("computed", "k--", "computed (K-1)/(M+K-1)"),
        ("profiled", "o-", "profile: threads idle"),
        ("profiled_per_stage", "^-", "profile: stages idle"),
        ("from_step_times", "s:", "1 - speed-up / K"),
    ):
        bubble_ax.plot(ms, [e["bubble"][key] for _, e in entries], style, label=label)
    config = result.get("config", {})
    for ax in (rate_ax, bubble_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.set_xlabel("micro-batches M")
        ax.legend(fontsize=8)
    rate_ax.set_ylabel("examples/s")
    rate_ax.set_title(
        f"MLP {config.get('input_dim')}-{len(config.get('hidden_units', []))}x"
        f"{(config.get('hidden_units') or [0])[0]}, batch {config.get('global_batch_size')}, "
        f"{len(config.get('split_at', [])) + 1} stages, 1 thread per device",
        fontsize=9,
    )
    bubble_ax.set_ylabel("bubble (idle share of a device)")
    bubble_ax.set_ylim(
        bottom=min([0.0, *(e["bubble"]["from_step_times"] or 0 for _, e in entries)])
    )
    _save(fig, path)
