"""The pipeline bench's bubble: GPipe's formula, and the one a profiler trace measures.

A pipeline of ``K`` stages over ``M`` micro-batches leaves each device idle for
``(K-1)/(M+K-1)`` of the step (GPipe's bubble: the fill and the drain), when the stages take
equal time and each device runs one op at a time. Measured: the step runs once under TF's
profiler (``tf.profiler.experimental``, nothing added to the graph: ``tf.timestamp`` markers
would be ordered by automatic control dependencies and serialise the stages), and each op
of the trace is given to its stage by its name, which carries the stage's sub-model
(``<model>_stage_<k>``, `tfdist.training.pipeline.options.cut`; the backward's ops too, under
``gradient_tape/``). The span is from the first stage op to the last. Two views of it:

* ``bubble``, the threads' idle share: ``1 - sum(op seconds) / (K * span)``. With one
  intra-op thread and ``K`` inter-op threads, ``K`` ops run at once, each on one thread:
  ``K`` threads are ``K`` devices' worth of compute, and this is the share of it unused.
* ``stage_bubble``, each stage's idle share: stage ``k`` is busy while any of its ops runs
  (the union of their intervals), ``1 - sum(busy) / (K * span)``. On a GPU each device runs
  its own stage's ops; TF's logical CPU devices share the process's threads, so two ops of
  one stage may run at once (two micro-batches' forward) and this view then reads idle time
  that the other thread spent on the same stage.

Ops of no stage (the optimizer's update, metrics, the input) count as idle time.
"""

from __future__ import annotations

import math
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tfdist.config import check_positive_int

#: The stage of an op, from its sub-model's name scope (TF may add ``_<n>`` to the name).
_STAGE = re.compile(r"_stage_(\d+)(?:_\d+)?/")

Interval = tuple[float, float]


def computed_bubble(stages: int, micro_batches: int) -> float:
    """GPipe's idle share of each device, ``(K-1)/(M+K-1)``.

    Raises:
        ValueError: For a non-positive ``stages`` or ``micro_batches``.
    """
    check_positive_int("stages", stages)
    check_positive_int("micro_batches", micro_batches)
    return (stages - 1) / (micro_batches + stages - 1)


def stage_of(op_name: str) -> int | None:
    """The stage whose sub-model an op's name scope names (the innermost), else None."""
    found = _STAGE.findall(op_name)
    return int(found[-1]) if found else None


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """``intervals`` merged where they overlap or touch, in order."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def intersection(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """The times both merged, ordered interval lists cover."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _length(intervals: Iterable[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def measured_bubble(events: Iterable[tuple[str, float, float]], stages: int) -> dict[str, Any]:
    """The bubble and what it comes from, out of a trace's ``(op name, start, end)`` events.

    Returns:
        ``{"bubble", "stage_bubble", "span_s", "work_s": [op seconds per stage], "busy_s":
        [per stage], "all_stages_s", "all_stages_share", "ops": [per stage]}`` (see the module
        docstring); the bubbles are NaN when a stage has no op in the trace.
    """
    check_positive_int("stages", stages)
    per_stage: list[list[Interval]] = [[] for _ in range(stages)]
    for name, start, end in events:
        k = stage_of(name)
        if k is not None and k < stages and end > start:
            per_stage[k].append((start, end))
    ops = [len(s) for s in per_stage]
    if not all(ops):
        nan = math.nan
        return {"bubble": nan, "stage_bubble": nan, "span_s": nan, "ops": ops}
    unions = [union(s) for s in per_stage]
    span = max(u[-1][1] for u in unions) - min(u[0][0] for u in unions)
    busy = [_length(u) for u in unions]
    work = [_length(s) for s in per_stage]
    together = unions[0]
    for u in unions[1:]:
        together = intersection(together, u)
    return {
        "bubble": 1.0 - sum(work) / (stages * span) if span > 0 else math.nan,
        "stage_bubble": 1.0 - sum(busy) / (stages * span) if span > 0 else math.nan,
        "span_s": span,
        "work_s": work,
        "busy_s": busy,
        "all_stages_s": _length(together),
        "all_stages_share": _length(together) / span if span > 0 else math.nan,
        "ops": ops,
    }


def profile(fn: Callable[[], Any]) -> list[tuple[str, float, float]] | None:
    """Runs ``fn()`` under TF's profiler and returns the trace's op events (None: unreadable).

    The trace goes to a temporary directory, removed afterwards.
    """
    import tensorflow as tf

    from tfdist._compat.tf_internals.profiler import trace_events

    logdir = tempfile.mkdtemp(prefix="tfdist-bench-pipeline-trace-")
    try:
        tf.profiler.experimental.start(logdir)
        try:
            fn()
        finally:
            tf.profiler.experimental.stop()
        return trace_events(logdir)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
