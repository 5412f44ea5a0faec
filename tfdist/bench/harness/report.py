"""Bench results for people and for scripts: a summary table, the JSON file and PNG charts.

Every ratio is shown with words (`describe`): the summary's lines, the chart's bars.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

logger = logging.getLogger(__name__)

# Keys plotted as ratios: "ratio" and anything ending in "_ratio" or "_mfu".
_RATIO_KEY = re.compile(r"(^|_)(ratio|mfu)$")
_GOAL = re.compile(r"^\s*(>=|<=)\s*([0-9.]+)\s*$")

#: What a ratio compares, in words, by benchmark and key (a nested dict's name is added in
#: front, e.g. "steps_per_execution_8: ..."). Keys not listed are shown as their name reads.
WORDS = {
    ("trainer_vs_fit", "ratio"): "Trainer.fit / Keras model.fit, examples/s",
    ("mfu", "trainer_mfu"): "Trainer's model FLOP utilisation (of the matmul peak)",
    ("mfu", "keras_fit_mfu"): "Keras model.fit's model FLOP utilisation",
    ("mfu", "mfu_ratio"): "Trainer / Keras model.fit, FLOP utilisation",
    ("accumulation", "ratio"): "with gradient accumulation / without, examples/s",
    ("bf16_vs_fp32", "ratio"): "mixed_bfloat16 / float32 Trainer step speed",
    ("bf16_vs_fp32", "matmul_speedup_ratio"): "bfloat16 / float32 matmul peak",
    ("bf16_vs_fp32", "realised_ratio"): "step speed-up / matmul speed-up",
    ("backup", "ratio"): "asynchronous backups / no backup, examples/s",
    ("backup", "paired_ratio"): "asynchronous backups / no backup, paired rounds",
    ("backup", "synchronous_ratio"): "synchronous backups / no backup, examples/s",
    ("backup", "synchronous_paired_ratio"): "synchronous backups / no backup, paired rounds",
    ("parameter_server", "ratio"): "Trainer / hand-written coordinator loop, examples/s",
    ("parameter_server", "cpu_ratio"): "hand-written loop / Trainer, CPU per step",
    ("scaling", "ratio"): "Trainer / raw TF loop at the most workers, examples/s",
    ("scaling", "trainer_vs_keras_fit_ratio"): "Trainer / Keras model.fit, examples/s",
    ("allreduce", "bf16_vs_fp32_time_ratio"): "bfloat16 / float32 all-reduce time",
    ("allreduce", "busbw_vs_tcp_loopback_ratio"): "bus bandwidth / TCP over loopback",
    ("stragglers", "expected_sync_ratio"): "expected, synchronous: 1 / slow-down factor",
    ("stragglers", "expected_independent_ratio"): "expected, independent workers",
    ("health", "ratio"): "watchdog and straggler report on / off, examples/s",
    ("health", "paired_ratio"): "on / off, paired rounds",
    ("health", "clean_paired_ratio"): "on / off, paired quiet rounds",
    ("health", "on_fast_ratio"): "on with fast checks / off, examples/s",
    ("first_fit", "ratio"): "Trainer / raw TF loop, steady examples/s",
    ("first_fit", "first_to_steady_ratio"): "first fit / a steady fit, seconds",
}
_SUFFIXES = (
    ("_efficiency_ratio", "{} scaling efficiency at the most workers"),
    ("_expected_ratio", "{}: expected with the straggler"),
    ("_ratio", "{}: with a straggler / without"),
)


def describe(benchmark: str, path: Sequence[str]) -> str:
    """The words for the ratio at ``path`` (keys from the benchmark's result) of ``benchmark``."""
    *parents, key = path
    words = WORDS.get((benchmark, key))
    if words is None and benchmark in ("scaling", "stragglers"):
        for suffix, template in _SUFFIXES:
            if key.endswith(suffix):
                words = template.format(key[: -len(suffix)].replace("_", " "))
                break
    words = words or key.replace("_", " ")
    return ": ".join([*(p.replace("_", " ") for p in parents), words])


def jsonable(value: Any) -> Any:
    """``value`` with NaN and infinities replaced by None (strict JSON has no NaN)."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(results: dict[str, Any], path: str) -> str:
    """Writes ``results`` to ``path`` as indented JSON (creating directories); returns the path."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=2, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)
    return path


def figures(results: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Yields every ratio in ``results["results"]``, as a dict for the summary and the chart.

    Ratios are the finite numbers under keys ``ratio``, ``*_ratio`` or ``*_mfu``, nested
    dicts included (e.g. ``trainer_vs_fit.steps_per_execution_8.ratio``). Each comes with
    ``benchmark``, ``key`` (the dotted path), ``value``, ``words`` (`describe`) and
    ``goal``: the benchmark's ``">= x"`` or ``"<= x"`` goal for the figure it is about: a key
    of its ``goals`` where it has them, else its top-level ``ratio`` and ``*_mfu``; else None.
    A benchmark may word its own top-level ratios: ``result["words"][key]`` (else `describe`).
    """

    def walk(path: list[str], node: dict[str, Any]) -> Iterator[tuple[list[str], float]]:
        for key, value in node.items():
            if isinstance(value, dict) and key not in ("config", "samples", "goals", "words"):
                yield from walk([*path, key], value)
            elif (
                _RATIO_KEY.search(key) and isinstance(value, (int, float)) and math.isfinite(value)
            ):
                yield [*path, key], float(value)

    for name, result in results.get("results", {}).items():
        goals = dict(result.get("goals") or {})
        own_words = dict(result.get("words") or {})
        for path, value in walk([], result):
            key = path[-1]
            goal = goals.get(key) if len(path) == 1 else None
            headline = key == "ratio" or key.endswith("_mfu")
            if goal is None and not goals and len(path) == 1 and headline:
                goal = result.get("goal")
            match = _GOAL.match(str(goal or ""))
            yield {
                "benchmark": name,
                "key": ".".join(path),
                "value": value,
                "words": (own_words.get(key) if len(path) == 1 else None) or describe(name, path),
                "goal": f"{match.group(1)} {match.group(2)}" if match else None,
                "met": _met(value, match) if match else None,
            }


def _met(value: float, goal: re.Match) -> bool:
    bound = float(goal.group(2))
    return value >= bound if goal.group(1) == ">=" else value <= bound


def ratios(results: dict[str, Any]) -> Iterator[tuple[str, float, float | None]]:
    """Yields ``(label, value, goal)`` for every ratio (`figures`); the goal's bound only."""
    for f in figures(results):
        goal = float(f["goal"].split()[1]) if f["goal"] else None
        yield f"{f['benchmark']}.{f['key']}", f["value"], goal


def summary(results: dict[str, Any], files: Sequence[str] = ()) -> str:
    """The table ``tfdist bench`` ends with: one line per figure, its goal and whether it is met.

    Built from the same numbers as the JSON (``results``), rounded for reading.
    """
    meta = results.get("meta", {})
    rows = [("benchmark", "figure", "value", "goal", "met")]
    for f in figures(results):
        met = "" if f["met"] is None else ("yes" if f["met"] else "NO")
        value = f"{f['value']:.3f}" if abs(f["value"]) < 100 else f"{f['value']:.4g}"
        rows.append((f["benchmark"], f["words"], value, f["goal"] or "", met))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        f"tfdist bench, {meta.get('date', '')}, {meta.get('machine', '')}, "
        f"repeats={meta.get('repeats', '')}"
        + (" (quick: the figures mean little)" if meta.get("quick") else "")
    ]
    if len(rows) == 1:
        lines.append("No ratio was measured.")
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines += [f"wrote {path}" for path in files]
    return "\n".join(lines) + "\n"


def write_png(results: dict[str, Any], path: str) -> str | None:
    """Draws a horizontal bar chart of the ratios; returns the path, or None without matplotlib."""
    rows = [(f"{f['benchmark']}: {f['words']}", f["value"], f["goal"]) for f in figures(results)]
    if not rows:
        return None
    try:
        _draw(rows, results.get("meta", {}), path)
    except ImportError:
        logger.info("matplotlib is not installed: no PNG chart")
        return None
    except Exception as e:  # the chart is optional: never lose the results over it
        logger.warning("Could not draw the bench chart %s: %s", path, e)
        return None
    return path


def write_other_png(plot: Any, result: dict[str, Any], path: str) -> str | None:
    """Runs a benchmark's own ``plot(result, path)``.

    Returns the path, or None without matplotlib or on error.
    """
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        plot(result, path)
    except ImportError:
        logger.info("matplotlib is not installed: no PNG %s", path)
        return None
    except Exception as e:  # the chart is optional: never lose the results over it
        logger.warning("Could not draw %s: %s", path, e)
        return None
    return path


def _draw(rows: list[tuple[str, float, str | None]], meta: dict[str, Any], path: str) -> None:
    # The object API with the Agg canvas: no pyplot, no global backend switch.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 0.45 * len(rows) + 1.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    positions = list(range(len(rows)))[::-1]
    ax.barh(positions, [v for _, v, _ in rows], color="tab:blue")
    for y, (_, value, goal) in zip(positions, rows):
        ax.text(value, y, f" {value:.2f}" + (f"  (goal {goal})" if goal else ""), va="center")
        if goal is not None:
            bound = float(goal.split()[1])
            ax.plot([bound, bound], [y - 0.4, y + 0.4], color="tab:red", linewidth=2)
    ax.axvline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_yticks(positions, [label for label, _, _ in rows], fontsize=8)
    ax.set_xlabel("ratio (red tick: the goal; dashed: 1)")
    ax.set_title(
        f"tfdist bench  {meta.get('date', '')}  {meta.get('machine', '')}  "
        f"repeats={meta.get('repeats', '')}",
        fontsize=9,
    )
    # Room for every bar, its value and its goal's words.
    ax.set_xlim(0, max(max(v for _, v, _ in rows), 1.0) * 1.45)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
