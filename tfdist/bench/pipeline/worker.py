"""What each process of ``tfdist bench --benchmarks=pipeline`` runs (its parent: ``parent.py``).

    python -m tfdist.bench.pipeline.worker   # a JSON spec, then JSON commands, on stdin

Started by the bench, one process per side, and kept alive for the whole run so that the
bench can alternate the sides' measurements. Before TensorFlow makes its devices, the
process sets one intra-op thread, ``spec["inter_op_threads"]`` inter-op threads (the ops
that may run at once) and ``spec["devices"]`` logical CPU devices. Then it answers one
command per stdin line with one line on stdout that starts with `REPLY`:

* ``{"op": "build", "micro_batches": M}``: a new Trainer (the spec's MLP, seeded; Adam;
  ``PipelineOptions(split_at, micro_batches=M, devices=spec["stage_devices"])``), trained
  ``warmup_steps`` steps; replies with the bytes of the parameters and of the optimizer's
  variables on each device, the total and the largest layer's;
* ``{"op": "time"}``: one fit of ``steps`` steps (`tfdist.bench.harness.fits.FitThroughput`);
  replies with examples/s, the steps' seconds, this process's CPU seconds and other
  processes' meanwhile;
* ``{"op": "profile"}``: one fit of one step under TF's profiler; replies with
  `tfdist.bench.pipeline.trace.measured_bubble` of its trace;
* ``{"op": "stop"}``: replies and exits.

An exception is replied as ``{"error": traceback}``, and the process exits.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback
from typing import Any

#: Starts each reply line on stdout (other lines there are not replies).
REPLY = "tfdist-bench-pipeline: "


def configure(spec: dict[str, Any]) -> None:
    """Threads and logical CPU devices; before anything makes TensorFlow's devices."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(int(spec["inter_op_threads"]))
    devices = int(spec["devices"])
    if devices > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(devices)]
        )


def _nbytes(variable: Any) -> int:
    value = variable.value
    return int(value.shape.num_elements()) * value.dtype.size


def bytes_by_device(variables: Any) -> dict[str, int]:
    """The variables' bytes on each device (``CPU:0``, ...), from their shapes."""
    import tensorflow as tf

    out: dict[str, int] = {}
    for v in variables:
        spec = tf.DeviceSpec.from_string(v.value.device)
        name = f"{spec.device_type}:{spec.device_index}"
        out[name] = out.get(name, 0) + _nbytes(v)
    return dict(sorted(out.items()))


class Side:
    """One side's Trainer, rebuilt for each ``M``, and its measurements."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from tfdist.bench.scaling.sides import make_dataset

        self.spec = spec
        self.batch = int(spec["global_batch_size"])
        self.dataset = make_dataset(spec, self.batch)
        self.trainer: Any = None

    def fit(self, **kwargs: Any) -> Any:
        """The Trainer's ``fit`` on the side's synthetic batches."""
        return self.trainer.fit(self.dataset, global_batch_size=self.batch, shuffle=False, **kwargs)

    def build(self, micro_batches: int) -> dict[str, Any]:
        """A new Trainer with ``micro_batches``, warmed up; the bytes on each device."""
        import keras

        import tfdist
        from tfdist.bench.harness import fits
        from tfdist.bench.scaling.sides import build_model

        self.trainer = None
        gc.collect()
        spec = self.spec
        keras.utils.set_random_seed(int(spec["seed"]))
        self.trainer = tfdist.Trainer(
            lambda: build_model(spec),
            optimizer=keras.optimizers.Adam(float(spec["learning_rate"])),
            loss=fits.logits_loss(),
            pipeline=tfdist.PipelineOptions(
                split_at=list(spec["split_at"]),
                micro_batches=micro_batches,
                devices=list(spec["stage_devices"]),
            ),
        )
        self.fit(epochs=1, steps_per_epoch=int(spec["warmup_steps"]), verbose=0)
        model = self.trainer.model
        return {
            "micro_batches": micro_batches,
            "global_batch_size": self.batch,
            "parameters": int(sum(v.value.shape.num_elements() for v in model.variables)),
            "parameter_bytes": bytes_by_device(model.variables),
            "optimizer_bytes": bytes_by_device(model.optimizer.variables),
            "total_parameter_bytes": sum(_nbytes(v) for v in model.variables),
            "largest_layer_bytes": max(sum(_nbytes(v) for v in x.variables) for x in model.layers),
        }

    def time(self) -> dict[str, Any]:
        """One timed fit of ``steps`` steps: examples/s, its seconds, whose CPU."""
        from tfdist.bench.harness import fits

        optimizer = self.trainer.model.optimizer
        steps = int(self.spec["steps"])
        measure = fits.FitThroughput(
            self.fit,
            steps=steps,
            global_batch_size=self.batch,
            iterations=lambda: int(optimizer.iterations.numpy()),
            from_epoch_begin=True,
        )
        rate, timing = measure()
        return {
            "examples_per_s": rate,
            "seconds": timing.seconds,
            "cpu_seconds": timing.cpu_seconds,
            "others_cpu_seconds": timing.others_cpu_seconds,
            "updates": measure.updates[0],
        }

    def profile(self) -> dict[str, Any]:
        """One step under TF's profiler: the bubble of its trace."""
        from tfdist.bench.pipeline import trace as pipeline_trace

        events = pipeline_trace.profile(lambda: self.fit(epochs=1, steps_per_epoch=1, verbose=0))
        if events is None:
            return {"bubble": None, "note": "no readable profiler trace"}
        return pipeline_trace.measured_bubble(events, len(self.spec["split_at"]) + 1)


def serve(spec: dict[str, Any], lines: Any, reply: Any) -> None:
    """Answers the commands of ``lines`` (JSON, one per line) through ``reply(dict)``."""
    side = Side(spec)
    for line in lines:
        command = json.loads(line)
        op = command.get("op")
        if op == "stop":
            reply({"stopped": True})
            return
        if op == "build":
            reply(side.build(int(command["micro_batches"])))
        elif op in ("time", "profile"):
            reply(getattr(side, op)())
        else:
            raise ValueError(f"Unknown command {command!r}; expected build, time, profile, stop")


def main() -> int:
    """Reads the spec, configures TF, then serves; returns the exit code."""
    out = sys.stdout

    def reply(message: dict[str, Any]) -> None:
        out.write(REPLY + json.dumps(message) + "\n")
        out.flush()

    try:
        spec = json.loads(sys.stdin.readline())
        configure(spec)
        sys.stdout = sys.stderr  # anything else printed goes to the log, not the replies
        reply({"ready": True, "pid": os.getpid()})
        serve(spec, sys.stdin, reply)
    except Exception:
        reply({"error": traceback.format_exc()})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
