"""``allreduce``: all-reduce bandwidth across worker processes, in the manner of nccl-tests.

    tfdist bench --benchmarks=allreduce
    tfdist bench --benchmarks=allreduce --allreduce_max_bytes=4194304   # stop at 4 MB

Two (``--allreduce_workers``) real worker processes, started by ``tfdist
launch`` on loopback, all-reduce (sum) messages of 1 KB to 64 MB of float32
(and the same number of bfloat16 elements: half the bytes) with every
communication implementation available (ring, auto; nccl with GPUs) and
packing: one tensor, or the message split into many small tensors, sent
as they are (``bytes_per_pack=0``) or packed into ``bytes_per_pack`` chunks.

For each, ``time_s`` is the median time of one all-reduce; as nccl-tests
defines them, ``algbw = bytes / time_s`` and ``busbw = algbw * 2 (n - 1) / n``,
the bytes each process sends and receives per second in a ring, comparable
across worker counts. The same run measures the host's own limits on the
same sizes: a numpy copy in one process and a TCP transfer between the two
worker processes over loopback.
"""

from __future__ import annotations

import logging
from typing import Any

from tfdist.bench.harness import cluster_run, common, plots, timing
from tfdist.config import invalid_argument

logger = logging.getLogger(__name__)

KB, MB = 1024, 1024 * 1024
DEFAULTS: dict[str, Any] = {
    "workers": 2,
    "min_bytes": KB,
    "max_bytes": 64 * MB,
    "implementations": ("ring", "auto", "nccl"),
    "dtypes": ("float32", "bfloat16"),
    "many_tensors": 64,
    "bytes_per_pack": 4 * MB,
    "repeats": 5,
    "bytes_per_call": 64 * MB,
    "min_iters": 2,
    "max_iters": 200,
    "threads_per_worker": None,
}
QUICK: dict[str, Any] = {
    "max_bytes": 16 * KB,
    "many_tensors": 4,
    "bytes_per_pack": 4 * KB,
    "repeats": 2,
    "bytes_per_call": 64 * KB,
    "max_iters": 8,
    "implementations": ("ring", "auto"),
}


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Message sizes (float32 bytes): ``min_bytes`` times 4, 16, ... up to ``max_bytes``."""
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= 4
    return out


def run(**overrides: Any) -> dict[str, Any]:
    """Runs the all-reduce sweep and the loopback limits; returns the results (no file written).

    Args:
        **overrides: Any key of `DEFAULTS`; ``quick=True`` applies `QUICK` first.

    Returns:
        ``{"config", "machine", "series": [{"label", "implementation", "packing", "dtype",
        "points": [{"bytes", "time_s", "algbw_GBps", "busbw_GBps", ...}]}],
        "loopback": {"numpy_copy": [...], "tcp_loopback": [...]}, "bf16_vs_fp32_time_ratio", ...}``

    Raises:
        ValueError: For a bad option.
        RuntimeError: If a worker process failed.
    """
    import portpicker

    options = cluster_run.merge_options(DEFAULTS, QUICK, overrides)
    workers = options["workers"]
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 2:
        raise invalid_argument("allreduce_workers", workers, "an integer >= 2")
    if not 0 < options["min_bytes"] <= options["max_bytes"]:
        raise invalid_argument(
            "allreduce_max_bytes", options["max_bytes"], f">= min_bytes={options['min_bytes']}"
        )
    threads = options["threads_per_worker"] or cluster_run.default_threads(workers)
    spec = {k: (list(v) if isinstance(v, tuple) else v) for k, v in options.items()}
    spec.update(
        kind="allreduce",
        threads_per_worker=threads,
        sizes=sizes(options["min_bytes"], options["max_bytes"]),
        packings={
            "one_tensor": [1, 0],
            f"{options['many_tensors']}_tensors": [options["many_tensors"], 0],
            f"{options['many_tensors']}_tensors_packed": [
                options["many_tensors"],
                options["bytes_per_pack"],
            ],
        },
        socket_port=portpicker.pick_unused_port(),
        pin_cores=True,
        num_pinned_tasks=workers,
    )
    launched = cluster_run.run_tasks(spec, workers=workers)
    lead = launched["tasks"]["worker-0"]
    n = lead["num_workers"]
    series = []
    for row in lead["series"]:
        for p in row["points"]:
            t = p.get("time_s")
            p["algbw_GBps"] = p["bytes"] / t / 1e9 if t else None
            p["busbw_GBps"] = p["algbw_GBps"] * 2 * (n - 1) / n if t else None
        series.append({**row, "label": f"{row['implementation']} {row['packing']} {row['dtype']}"})
    result: dict[str, Any] = {
        "config": spec,
        "machine": cluster_run.machine(),
        "num_workers": n,
        "series": series,
        "loopback": lead["loopback"],
        "threads": {t: r["threads"] for t, r in launched["tasks"].items()},
        "others_cpu_whole_launch": launched["others_cpu"],
        "launch_seconds": launched["launch_seconds"],
    }
    result.update(headlines(series, lead["loopback"]))
    return result


def _times(series: list[dict[str, Any]], dtype: str) -> dict[int, float]:
    for row in series:
        if (
            row["implementation"] == "ring"
            and row["packing"] == "one_tensor"
            and row["dtype"] == dtype
        ):
            return {p["fp32_bytes"]: p["time_s"] for p in row["points"] if p.get("time_s")}
    return {}


def headlines(
    series: list[dict[str, Any]], loopback: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    """16-bit / 32-bit time at >= 4 MB (ring, one tensor); best busbw vs the loopback TCP limit."""
    fp32, bf16 = _times(series, "float32"), _times(series, "bfloat16")
    large = [s for s in fp32 if s >= 4 * MB and s in bf16] or sorted(set(fp32) & set(bf16))[-1:]
    out: dict[str, Any] = {
        "bf16_vs_fp32_time_ratio": timing.median([bf16[s] / fp32[s] for s in large])
        if large
        else None,
        "bf16_vs_fp32_sizes": large,
        "bf16_vs_fp32_goal": "<= 0.6 at >= 4 MB",
    }
    top = max((p["bytes"] for row in series for p in row["points"]), default=0)
    best = timing.nanmax(
        p.get("busbw_GBps") or float("nan")
        for row in series
        for p in row["points"]
        if p["bytes"] == top and row["dtype"] == "float32"
    )
    tcp = {p["bytes"]: p["GBps"] for p in loopback.get("tcp_loopback", [])}
    out["busbw_vs_tcp_loopback_ratio"] = timing.ratio(best, tcp.get(top) or float("nan"))
    return out


@common.register("allreduce", plot=plots.plot_allreduce)
def allreduce(repeats: int, quick: bool) -> dict[str, Any]:
    """The registered benchmark: `run` with the bench's options (``tfdist bench`` flags)."""
    names = {
        "allreduce_workers": "workers",
        "allreduce_max_bytes": "max_bytes",
        "allreduce_min_bytes": "min_bytes",
        "threads_per_worker": "threads_per_worker",
    }
    options = {names[k]: v for k, v in common.options().items() if k in names}
    options.setdefault("repeats", repeats)
    return run(quick=quick, **options)
