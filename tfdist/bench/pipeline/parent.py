"""``pipeline``: pipeline stages on two devices against one device doing the same work.

    tfdist bench --benchmarks=pipeline

An MLP of equal Dense layers (1024 wide, 8 hidden, synthetic data, a fixed seed) with Adam,
trained by the Trainer with ``pipeline=PipelineOptions(split_at, micro_batches=M)`` for
M = 1, 2, 4, 8, cut into ``stages`` stages of equal size. Three processes, one per side
(`tfdist.bench.pipeline.worker`), started once and kept for the whole run, so that their
threads and devices are set before TensorFlow starts and their measurements alternate:

* ``pipeline``: ``K`` logical CPU devices, one stage on each, one intra-op thread and ``K``
  inter-op threads (``K`` ops at once, one thread each: a thread per device);
* ``one_device``: the same Trainer, model, batch and ``M``, every stage on ``CPU:0``, one
  intra-op and one inter-op thread (one op at a time: one device of one thread);
* ``one_device_threads``: as ``one_device`` but with ``K`` inter-op threads, the pipeline's
  threads without its devices: what placing the stages on devices adds on a CPU.

Per M, after a warm-up: ``repeats`` timed fits of ``steps`` steps on each side, alternated
(`tfdist.bench.harness.timing.alternate`, medians over the fits during which other processes took
at most ``timing.BUSY_CPU`` cores), and ``profiles`` single steps of the pipeline under TF's
profiler (`tfdist.bench.pipeline.trace`). Reported:

* parameter bytes per device: at most 1/K of the model plus its largest layer (goal);
* examples/s and seconds per step of each side; pipeline / one device (goal at M=8, K=2:
  >= 1.3); pipeline / one device with the same threads (no goal);
* the bubble: computed ``(K-1)/(M+K-1)``; measured from the profile (the median: the
  threads' idle share, and each stage's, `tfdist.bench.pipeline.trace`); and
  ``1 - speedup / K`` from the step times.

TF's logical CPU devices share the process's threads: nothing binds a thread to a device,
so two ops of one stage may run at once (docs/benchmarks.md, "Pipeline stages").
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import tempfile
import threading
from typing import Any

from tfdist.bench.harness import cluster_run, common, plots, timing
from tfdist.bench.pipeline import trace as pipeline_trace
from tfdist.bench.pipeline.worker import REPLY
from tfdist.config import check_positive_int, invalid_argument

logger = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
    "micro_batches": (1, 2, 4, 8),
    "stages": 2,
    "input_dim": 1024,
    "hidden_units": (1024,) * 8,
    "num_classes": 10,
    "global_batch_size": 512,
    "warmup_steps": 2,
    "steps": 15,
    "repeats": 3,
    "profiles": 3,
    "learning_rate": 1e-3,
    "seed": 0,
}
# --quick and tests: both processes real, the model tiny (the figures mean little).
QUICK: dict[str, Any] = {
    "micro_batches": (1, 2),
    "input_dim": 32,
    "hidden_units": (32, 32),
    "global_batch_size": 16,
    "warmup_steps": 1,
    "steps": 2,
    "repeats": 1,
    "profiles": 1,
}
#: The issue's goals: throughput at `GOAL_MICRO_BATCHES` micro-batches and 2 stages.
RATE_GOAL, GOAL_MICRO_BATCHES = ">= 1.3", 8
SIDES = ("pipeline", "one_device", "one_device_threads")


def split_points(hidden_layers: int, stages: int) -> list[str]:
    """The layers of the bench's MLP (``dense_<i>``) after which to cut it into ``stages``
    stages of (nearly) equal hidden layers; the logits go with the last stage.

    Raises:
        ValueError: For fewer hidden layers than stages, or fewer than 2 stages.
    """
    check_positive_int("stages", stages)
    if stages < 2 or hidden_layers < stages:
        raise invalid_argument(
            "stages",
            stages,
            f"2 to {hidden_layers} (one stage per hidden layer at most; hidden_units has "
            f"{hidden_layers} layers)",
        )
    return [f"dense_{(k + 1) * hidden_layers // stages - 1}" for k in range(stages - 1)]


def _check(options: dict[str, Any]) -> None:
    micro = options["micro_batches"]
    if not isinstance(micro, (list, tuple)) or not micro:
        raise invalid_argument("micro_batches", micro, "micro-batch counts, e.g. (1, 2, 4, 8)")
    for m in micro:
        check_positive_int("micro_batches", m)
    counts = ("input_dim", "num_classes", "global_batch_size", "warmup_steps", "steps")
    for key in (*counts, "repeats", "profiles", "stages"):
        check_positive_int(key, options[key])
    hidden = options["hidden_units"]
    if not hidden or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in hidden):
        raise invalid_argument("hidden_units", hidden, "positive layer widths, e.g. (1024, 1024)")
    split_points(len(hidden), options["stages"])
    batch = options["global_batch_size"]
    for m in micro:
        if batch % m:
            raise invalid_argument(
                "global_batch_size", batch, f"a multiple of every micro_batches, {list(micro)}"
            )
    rate = options["learning_rate"]
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise invalid_argument("learning_rate", rate, "a positive number")
    if isinstance(options["seed"], bool) or not isinstance(options["seed"], int):
        raise invalid_argument("seed", options["seed"], "an integer")


def side_specs(options: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each side's worker spec: the model, the cut, its devices and threads."""
    k = options["stages"]
    spec = {key: (list(v) if isinstance(v, tuple) else v) for key, v in options.items()}
    spec.update(split_at=split_points(len(options["hidden_units"]), k))
    spec["learning_rate"] = float(spec["learning_rate"])
    return {
        "pipeline": {
            **spec,
            "devices": k,
            "inter_op_threads": k,
            "stage_devices": [f"/device:CPU:{i}" for i in range(k)],
        },
        "one_device": {
            **spec,
            "devices": 1,
            "inter_op_threads": 1,
            "stage_devices": ["/device:CPU:0"] * k,
        },
        "one_device_threads": {
            **spec,
            "devices": 1,
            "inter_op_threads": k,
            "stage_devices": ["/device:CPU:0"] * k,
        },
    }


class Worker:
    """One side's process (`tfdist.bench.pipeline.worker`): started, asked, stopped.

    Its stderr (TF's logs and anything it prints) goes to a temporary file, whose tail a
    failure shows.

    Args:
        side: The side's name, for messages.
        spec: The side's spec (`side_specs`), sent first.
        timeout: Seconds after which a command without a reply kills the process.
    """

    def __init__(self, side: str, spec: dict[str, Any], timeout: float = 600.0) -> None:
        self.side, self.timeout = side, timeout
        self.log = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tfdist.bench.pipeline.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=cluster_run.task_env(1),
        )
        self.send(spec)
        self.ready = self.read()

    def send(self, message: dict[str, Any]) -> None:
        """Writes one command (or the spec) on the process's stdin."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def read(self) -> dict[str, Any]:
        """The next reply; raises RuntimeError with the log's tail if the worker failed."""
        assert self.process.stdout is not None
        watchdog = threading.Timer(self.timeout, self.process.kill)
        watchdog.start()
        try:
            for line in self.process.stdout:
                if line.startswith(REPLY):
                    reply = json.loads(line[len(REPLY) :])
                    if "error" in reply:
                        self._failed(reply["error"])
                    return reply
        finally:
            watchdog.cancel()
        self._failed(f"it exited without a reply (killed after {self.timeout:.0f} s without one?)")
        raise AssertionError("unreachable")

    def ask(self, op: str, **arguments: Any) -> dict[str, Any]:
        """Sends command ``op`` and returns its reply."""
        self.send({"op": op, **arguments})
        return self.read()

    def _failed(self, why: str) -> None:
        self.log.seek(0)
        tail = "".join(self.log.readlines()[-30:])
        raise RuntimeError(f"bench pipeline: the {self.side} process failed: {why}\n{tail}")

    def close(self) -> None:
        """Stops the process (asks, then kills it if it does not exit)."""
        try:
            if self.process.poll() is None:
                self.send({"op": "stop"})
                self.process.wait(timeout=30)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        finally:
            self.log.close()


def _timed(worker: Worker) -> tuple[float, timing.Timing]:
    reply = worker.ask("time")
    took = timing.Timing(reply["seconds"], reply["cpu_seconds"], reply["others_cpu_seconds"])
    return reply["examples_per_s"], took


def measure(workers: dict[str, Worker], options: dict[str, Any], m: int) -> dict[str, Any]:
    """One ``M``: every side built (at once), their fits alternated, the pipeline profiled."""
    for worker in workers.values():
        worker.send({"op": "build", "micro_batches": m})
    built = {side: worker.read() for side, worker in workers.items()}
    logger.info("bench pipeline: M=%d built, %d timed fits per side", m, options["repeats"])
    samples = timing.alternate(
        {side: (lambda w=worker: _timed(w)) for side, worker in workers.items()}, options["repeats"]
    )
    profiles = [workers["pipeline"].ask("profile") for _ in range(options["profiles"])]
    return {"built": built, "samples": samples.as_dict(), "profiles": profiles}


def run(**overrides: Any) -> dict[str, Any]:
    """Runs the benchmark and returns its results (no file written; see ``tfdist bench``).

    Args:
        **overrides: Any key of `DEFAULTS`, e.g. ``micro_batches=(4, 8)``, ``steps=20``;
            ``quick=True`` applies `QUICK` first.

    Returns:
        ``{"config", "machine", "per_micro_batches": {"1": {...}, ...}, "parameter_bytes",
        "parameter_share_ratio", "m<M>_throughput_ratio", "m<M>_same_threads_ratio",
        "m<M>_bubble_ratio", "goals", "words", "others_cpu_max"}``: see docs/benchmarks.md,
        "Pipeline stages".

    Raises:
        ValueError: For a bad option (Keras-style message naming it).
        RuntimeError: If a worker process failed.
    """
    options = cluster_run.merge_options(DEFAULTS, QUICK, overrides)
    _check(options)
    options["micro_batches"] = tuple(sorted(set(options["micro_batches"])))
    specs = side_specs(options)
    workers: dict[str, Worker] = {}
    per_m: dict[str, Any] = {}
    try:
        for side in SIDES:
            workers[side] = Worker(side, specs[side])
        for m in options["micro_batches"]:
            per_m[str(m)] = measure(workers, options, m)
    finally:
        for worker in workers.values():
            worker.close()
    return summarise(specs["pipeline"], per_m)


def parameter_share(built: dict[str, Any], stages: int) -> tuple[float, float]:
    """``(share, bound)``: the most parameter bytes on one device over 1/K of the model, and
    the goal's bound on it, 1 plus the largest layer over 1/K (rounded up at 3 decimals)."""
    ideal = built["total_parameter_bytes"] / stages
    share = max(built["parameter_bytes"].values()) / ideal
    return share, math.ceil((1 + built["largest_layer_bytes"] / ideal) * 1e3) / 1e3


def _samples(saved: dict[str, Any]) -> timing.Samples:
    fields = ("values", "cpu_share", "others_cpu", "seconds")
    return timing.Samples(**{f: saved[f] for f in fields})


def micro_batch_figures(entry: dict[str, Any], m: int, stages: int) -> dict[str, Any]:
    """One ``M``'s figures: each side's examples/s and step time (medians over the quiet
    fits, else over all), the speed-up, and the bubble computed, profiled and from steps."""
    samples = _samples(entry["samples"])
    batch = next(iter(entry["built"].values())).get("global_batch_size")
    sides = {}
    for side in SIDES:
        rate = samples.median(side)
        sides[side] = {
            "examples_per_s": rate,
            "step_s": timing.ratio(batch, rate) if batch else math.nan,
            "quiet_fits": len(samples.clean(side)),
            "fits": len(samples.values[side]),
        }
    rate = sides["pipeline"]["examples_per_s"]
    speedup = timing.ratio(rate, sides["one_device"]["examples_per_s"])

    def profiled(key: str) -> float:
        values = [p.get(key) for p in entry["profiles"]]
        return timing.median([v for v in values if isinstance(v, float) and math.isfinite(v)])

    return {
        "sides": sides,
        "speedup": speedup,
        "versus_same_threads": timing.ratio(rate, sides["one_device_threads"]["examples_per_s"]),
        "bubble": {
            "computed": pipeline_trace.computed_bubble(stages, m),
            "profiled": profiled("bubble"),
            "profiled_per_stage": profiled("stage_bubble"),
            "all_stages_share": profiled("all_stages_share"),
            "from_step_times": 1.0 - speedup / stages,
            "profiles": entry["profiles"],
        },
        "built": entry["built"],
        "samples": entry["samples"],
    }


def noisy(figures: dict[str, Any], sides: tuple[str, ...]) -> str:
    """Words that flag a ratio whose side had no quiet fit (other processes took a core)."""
    loud = [side for side in sides if not figures["sides"][side]["quiet_fits"]]
    return f" (no quiet fit: {', '.join(loud)})" if loud else ""


def summarise(spec: dict[str, Any], per_m: dict[str, Any]) -> dict[str, Any]:
    """The config, the machine, each ``M``'s figures, the table's ratios, goals and words."""
    k = len(spec["split_at"]) + 1
    out: dict[str, Any] = {
        "config": {**spec, "optimizer": "adam"},
        "machine": cluster_run.machine(),
    }
    out.update(per_micro_batches={}, goals={}, words={})
    others = []
    for key in sorted(per_m, key=int):
        m = int(key)
        figures = micro_batch_figures(per_m[key], m, k)
        out["per_micro_batches"][key] = figures
        others += [o for side in SIDES for o in per_m[key]["samples"]["others_cpu"][side]]
        rate = f"m{m}_throughput_ratio"
        out[rate] = figures["speedup"]
        out["words"][rate] = f"M={m}: {k} stages on {k} devices / one device, examples/s" + (
            noisy(figures, ("pipeline", "one_device"))
        )
        if m == GOAL_MICRO_BATCHES and k == 2:
            out["goals"][rate] = RATE_GOAL
        same = f"m{m}_same_threads_ratio"
        out[same] = figures["versus_same_threads"]
        out["words"][same] = (
            f"M={m}: pipeline / one device with the same {k} threads, examples/s"
            + noisy(figures, ("pipeline", "one_device_threads"))
        )
        bubble = f"m{m}_bubble_ratio"
        out[bubble] = figures["bubble"]["profiled"]
        out["words"][bubble] = (
            f"M={m}: bubble, threads idle in the profile (computed "
            f"{figures['bubble']['computed']:.3f}, from step times "
            f"{figures['bubble']['from_step_times']:.3f})"
        )
    first = out["per_micro_batches"][min(per_m, key=int)]["built"]["pipeline"]
    share, bound = parameter_share(first, k)
    out["parameter_bytes"] = {
        "per_device": first["parameter_bytes"],
        "optimizer_per_device": first["optimizer_bytes"],
        "total": first["total_parameter_bytes"],
        "largest_layer": first["largest_layer_bytes"],
        "parameters": first["parameters"],
    }
    out["parameter_share_ratio"] = share
    out["words"]["parameter_share_ratio"] = f"most parameter bytes on one device / (model / {k})"
    out["goals"]["parameter_share_ratio"] = f"<= {bound}"
    out["others_cpu_max"] = timing.nanmax(o for o in others if o is not None)
    return out


@common.register("pipeline", plot=plots.plot_pipeline)
def pipeline(repeats: int, quick: bool) -> dict[str, Any]:
    """The registered benchmark: `run` with the bench's ``--repeats`` and ``--quick``."""
    return run(quick=quick, repeats=repeats)
