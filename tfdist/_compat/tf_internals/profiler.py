"""TF profiler traces read back: the op events of a ``tf.profiler.experimental`` trace.

Reason: TF writes its traces as ``*.xplane.pb`` (an ``XSpace`` protocol buffer) and has no
public reader; its message class lives in ``tensorflow.tsl.profiler.protobuf.xplane_pb2``.
Used by ``tfdist bench --benchmarks=pipeline`` (`tfdist.bench.pipeline.trace`) to see when
each stage's ops ran. Returns None when the module is gone, so the bench says "unknown".
"""

from __future__ import annotations

import glob
import os


def trace_events(logdir: str) -> list[tuple[str, float, float]] | None:
    """Every op event with a duration in the traces under ``logdir``: ``(name, start, end)``.

    Times are in seconds on the trace's clock (one clock for every thread of a host). The
    name is the op's full name, name scopes included (``.../mlp_stage_0/dense_0/MatMul``).

    Returns:
        The events, in no order; None if this TF has no ``xplane_pb2`` or no trace was written.
    """
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError:
        return None
    paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        return None
    events = []
    for path in paths:
        space = xplane_pb2.XSpace()
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
        for plane in space.planes:
            names = plane.event_metadata
            for line in plane.lines:
                for event in line.events:
                    if event.duration_ps <= 0 or event.metadata_id not in names:
                        continue
                    start = (line.timestamp_ns * 1000 + event.offset_ps) * 1e-12
                    events.append(
                        (names[event.metadata_id].name, start, start + event.duration_ps * 1e-12)
                    )
    return events
