"""Writes bench results: the JSON file and, when matplotlib is there, a PNG of the ratios."""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)

# Keys plotted as ratios: "ratio" and anything ending in "_ratio" or "_mfu".
_RATIO_KEY = re.compile(r"(^|_)(ratio|mfu)$")
_GOAL = re.compile(r"^\s*>=\s*([0-9.]+)\s*$")


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


def ratios(results: dict[str, Any]) -> Iterator[tuple[str, float, float | None]]:
    """Yields ``(label, value, goal)`` for every ratio in ``results["results"]``.

    Ratios are the finite numbers under keys ``ratio``, ``*_ratio`` or ``*_mfu``,
    nested dicts included (e.g. ``trainer_vs_fit.steps_per_execution_8.ratio``).
    A benchmark's ``">= x"`` goal is about its top-level ``ratio`` and ``*_mfu``
    keys; other ratios get ``None``.
    """

    def walk(
        prefix: str, node: dict[str, Any], goal: float | None
    ) -> Iterator[tuple[str, float, float | None]]:
        for key, value in node.items():
            if isinstance(value, dict) and key not in ("config", "samples"):
                yield from walk(f"{prefix}.{key}", value, None)
            elif (
                _RATIO_KEY.search(key) and isinstance(value, (int, float)) and math.isfinite(value)
            ):
                headline = key == "ratio" or key.endswith("_mfu")
                yield f"{prefix}.{key}", float(value), goal if headline else None

    for name, result in results.get("results", {}).items():
        match = _GOAL.match(str(result.get("goal", "")))
        yield from walk(name, result, float(match.group(1)) if match else None)


def write_png(results: dict[str, Any], path: str) -> str | None:
    """Draws a horizontal bar chart of the ratios; returns the path, or None without matplotlib."""
    rows = list(ratios(results))
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


def _draw(rows: list[tuple[str, float, float | None]], meta: dict[str, Any], path: str) -> None:
    # The object API with the Agg canvas: no pyplot, no global backend switch.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 0.5 * len(rows) + 1.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    positions = list(range(len(rows)))[::-1]
    ax.barh(positions, [v for _, v, _ in rows], color="tab:blue")
    for y, (_, value, goal) in zip(positions, rows):
        ax.text(value, y, f" {value:.2f}", va="center")
        if goal is not None:
            ax.plot([goal, goal], [y - 0.4, y + 0.4], color="tab:red", linewidth=2)
    ax.axvline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_yticks(positions, [label for label, _, _ in rows])
    ax.set_xlabel("ratio (red tick: goal)")
    ax.set_title(
        f"tfdist bench  {meta.get('date', '')}  repeats={meta.get('repeats', '')}", fontsize=9
    )
    ax.set_xlim(0, max(max(v for _, v, _ in rows), 1.0) * 1.2)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
