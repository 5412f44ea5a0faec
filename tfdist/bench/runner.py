"""``tfdist bench``: side-by-side measurements in one process, reported as ratios.

    python -m tfdist bench --output=bench_results/bench.json
    python -m tfdist bench --benchmarks=mfu --repeats=5
    # worker processes; minutes:
    python -m tfdist bench --benchmarks=scaling,allreduce --threads_per_worker=1

This machine is noisy, so every benchmark compares two sides measured in the
same process, alternating between them, and reports medians and their ratio;
absolute numbers are secondary. Results go to a JSON file and, when matplotlib
is installed, a PNG bar chart of the ratios next to it (and a benchmark's own
figure, registered with ``plot=``, as ``<output>.<name>.png``). The
multi-process benchmarks (``scaling``, ``allreduce``, ``stragglers``, ``balance``, ``health``,
``time_to_accuracy``, ``first_fit``, ``memory``) start their own worker processes with
``tfdist launch``, ``pipeline`` its three processes itself; they run only when named.

To add a benchmark, write a module (`tfdist.bench.names` says where) with a function
``(repeats, quick) -> dict`` decorated by ``@common.register("name")``, and add it to
`tfdist.bench.names.BENCHMARKS`, the one registry of the names. Build it from
``timing.alternate`` (and ``fits.fit_sides`` for Trainer-vs-Keras comparisons); put its
headline ratio under ``"ratio"`` (or ``"*_ratio"``/``"*_mfu"``), its target under ``"goal"``
(``">= x"``), and ``samples.max_others_cpu()`` under ``"others_cpu_max"``.
"""

from __future__ import annotations

import datetime
import importlib
import logging
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from typing import Any

from tfdist.bench.harness import common, report, timing
from tfdist.bench.harness.cluster_run import WORKER_MODULE
from tfdist.bench.names import LAUNCHING, MODULES, OWN_PROCESSES
from tfdist.config import check_positive_int, invalid_argument

logger = logging.getLogger(__name__)

#: Benchmarks that start their own worker processes and take minutes: run only when named
#: (`tfdist.bench.names.LAUNCHING`, the one registry's).
ON_REQUEST = LAUNCHING


def _load_builtins() -> None:
    # Importing the modules runs their @common.register decorators.
    for module in MODULES:
        importlib.import_module(module)


def available() -> tuple[str, ...]:
    """The benchmark names ``run`` accepts, sorted."""
    _load_builtins()
    return tuple(sorted(common.registry()))


def _meta(repeats: int, quick: bool) -> dict[str, Any]:
    import keras
    import tensorflow as tf

    import tfdist

    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        affinity = None
    return {
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "tfdist": tfdist.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "logical_cpu_devices": len(tf.config.list_logical_devices("CPU")),
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": _machine(),
        "repeats": repeats,
        "quick": quick,
    }


def _machine() -> str:
    """The CPU model and the flags that decide bf16 speed, e.g. ``AMD EPYC, avx512_bf16``."""
    from tfdist.bench.in_process.bf16_vs_fp32 import cpu_features

    features = cpu_features()
    flags = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if features.get(f)]
    return ", ".join([features.get("model_name") or "unknown CPU", *flags])


def _checked_preload(names: Sequence[str], options: dict[str, Any] | None) -> dict[str, Any]:
    """``options`` with ``preload`` checked: module names, and a benchmark that launches tasks."""
    from tfdist.launch.preload import check_preload  # bench starts tasks through launch

    options = dict(options or {})
    preload = check_preload(options.get("preload"), [sys.executable, "-m", WORKER_MODULE])
    launching = [n for n in ON_REQUEST if n not in OWN_PROCESSES]
    if preload and not any(n in launching for n in names):
        raise invalid_argument(
            "preload",
            ",".join(preload),
            "no modules: none of the benchmarks run "
            f"({', '.join(names)}) starts processes to preload them into",
            note=f"The ones that do: {', '.join(launching)}.",
        )
    options["preload"] = preload or None
    return options


def run(
    names: Sequence[str] | None = None,
    *,
    output: str | None = "bench_results/bench.json",
    repeats: int = 3,
    quick: bool = False,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Runs benchmarks and returns (and writes) their results.

    Creates the shared strategies first, before any other TensorFlow work: the
    mirrored strategy needs 2 CPU devices, which exist only if they are
    configured before TF initialises. Benchmarks on the parameter-server
    strategy run after all the others (its cluster disables the local
    strategies; see ``common.strategy``).

    Args:
        names: Benchmarks to run, in this order (cluster ones last); default
            all of `available` but the multi-process ones
            (`ON_REQUEST`: ``scaling``, ``allreduce``, ``stragglers``, ``balance``, ``health``,
            ``time_to_accuracy``, ``first_fit``, ``memory``, ``pipeline``), which run only
            when named.
        output: Path of the JSON file (directories are created); a PNG chart of
            the ratios goes next to it. ``None`` writes nothing.
        repeats: Timed measurements per side (a few more when other processes
            disturb them); medians are reported.
        quick: Shrinks sizes and steps so that everything runs in seconds
            (for tests; the figures then mean little).
        options: Benchmark options, e.g. ``{"threads_per_worker": 1,
            "gradient_compression": ("none", "bf16")}`` for ``scaling`` (see
            ``tfdist.bench.scaling.parent.DEFAULTS`` and
            ``tfdist.bench.allreduce.parent.DEFAULTS``).
            ``"preload": ("tensorflow", "keras")`` forks the tasks of the benchmarks that
            launch processes from one Python that imported those modules, as
            ``tfdist launch --preload`` does (a faster start; it is refused when no named
            benchmark launches processes).

    Returns:
        ``{"meta": {versions, cpu count, date, repeats, ...}, "results": {name: {...}}}``;
        unknown or undefined numbers (NaN) are None, as in the JSON file.

    Raises:
        ValueError: For an unknown benchmark name, a non-positive ``repeats`` or a bad
            ``preload``;
            if TF was initialised with fewer than 2 CPU devices.
    """
    common.init_strategies()
    check_positive_int("repeats", repeats)
    valid = available()
    default = [n for n in valid if n not in ON_REQUEST]
    names = list(default if names is None else [names] if isinstance(names, str) else names)
    for name in names:
        if name not in valid:
            raise invalid_argument("benchmarks", name, sorted(valid))
    # Stable: benchmarks that connect to the in-process cluster go last (see common.strategy).
    ordered = sorted(names, key=common.connects_cluster)
    if ordered != names:
        logger.info(
            "bench: running %s last (after it the local strategies stop working)",
            ", ".join(n for n in ordered if common.connects_cluster(n)),
        )
    names = ordered
    benchmarks = common.registry()
    common.set_options(_checked_preload(names, options))
    results: dict[str, Any] = {"meta": _meta(repeats, quick), "results": {}}
    for name in names:
        logger.info("bench %s: running (repeats=%d%s)", name, repeats, ", quick" if quick else "")
        start = time.perf_counter()
        result = benchmarks[name](repeats, quick)
        result["seconds"] = round(time.perf_counter() - start, 2)
        results["results"][name] = report.jsonable(result)
        logger.info("bench %s: done in %.1f s", name, result["seconds"])
        busy = result.get("others_cpu_max", math.nan)
        if busy > timing.BUSY_CPU:  # False for NaN (unknown)
            logger.warning(
                "bench %s: other processes took up to %.1f CPU cores during some measurements; "
                "medians use the clean ones where there are any (see samples.others_cpu, "
                "samples.clean)",
                name,
                busy,
            )
    if output is not None:
        _write(results, names, output)
    return results


def _write(results: dict[str, Any], names: Sequence[str], output: str) -> None:
    """Writes the JSON, the chart of the ratios and each benchmark's own chart; logs each file.

    ``results["meta"]["files"]`` lists every file written, the JSON first.
    """
    for name in names:
        plot = common.plotter(name)
        if plot is not None:
            path = f"{os.path.splitext(output)[0]}.{name}.png"
            results["results"][name]["chart"] = report.write_other_png(
                plot, results["results"][name], path
            )
    chart = report.write_png(results, os.path.splitext(output)[0] + ".png")
    results["meta"]["chart"] = chart
    charts = [chart] + [results["results"][n].get("chart") for n in names]
    results["meta"]["files"] = [output] + [c for c in charts if c]
    report.write_json(results, output)
    for path in results["meta"]["files"]:
        logger.info("bench: wrote %s", path)
