"""What each task of ``tfdist bench --benchmarks=balance`` runs (``tfdist.bench.balance.parent``).

Every worker is pinned to its own core. With ``spec["hog"]`` worker 1 first starts a noisy
neighbour, a Python busy loop pinned to this task's own CPUs (``os.sched_getaffinity(0)``),
which leaves it about half its core; the loop ends when the task does (it polls its
parent's pid, so it cannot outlive a parameter-server worker that the launcher kills).

On the latency sides worker 1 instead sleeps ``spec["latency_s"]`` in every forward pass
(a `Delay` before the model: a worker that waits rather than computes).

Then, under MultiWorkerMirrored, each worker measures its own compute rate alone-ish: a
local copy of the model (no strategy, no all-reduce) trains ``rate_steps`` steps of half
the global batch, both workers at once, the hog running (examples/s: the ideal's inputs).
Then one Trainer fit of ``epochs`` epochs of ``steps_per_epoch`` updates, balance on or off
as the spec says; at each epoch's end every worker records its wall clock, its own CPU,
the hog's CPU and the machine's busy CPU (so the parent can tell a busy epoch), and the
chief keeps each ``Balance:`` line it logs, with the time.
Under ParameterServerStrategy only the chief (the coordinator) records epochs; workers and
the ps serve.

The A/B sides (`run_ab`) measure no rate: each worker builds an even and a balanced Trainer
on one strategy and alternates their fits in this one launch, recording each fit as above;
on ``loaded_ab`` every worker has a hog on its own core (``spec["hog_all"]``). At each of
their epochs' ends every worker also times a fixed compute, the yardstick
(`yardstick_cpu_seconds`: this core's speed of the moment), beside its clocks.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfdist
from tfdist.bench.harness import fits, timing
from tfdist.bench.harness.worker_common import report_progress, task

NUM_BATCHES = 4  # distinct global batches, cached and repeated
DIGITS_SHAPE = (8, 8, 1)  # scikit-learn's digits, the cnn's inputs

HOG_CODE = """import os, sys
os.sched_setaffinity(0, {cpus!r})
parent = {parent}
while os.getppid() == parent:
    for _ in range(1000000):
        pass
"""


def start_hog(cpus: Any) -> subprocess.Popen:
    """A busy loop on ``cpus`` that ends when this process does (a noisy neighbour)."""
    code = HOG_CODE.format(cpus=sorted(cpus), parent=os.getpid())
    return subprocess.Popen([sys.executable, "-c", code])


def host_pid(child: subprocess.Popen, wait_s: float = 2.0) -> int | None:
    """``child``'s pid as ``/proc`` numbers it (a task in its own pid namespace sees another
    number in ``child.pid``): the child of this process whose command line is ``child``'s,
    looked for until it has one (a child just started may not have exec'd yet) or ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        pid = _child_with_args("\0".join(child.args).encode())
        if pid is not None or time.monotonic() >= deadline:
            return pid
        time.sleep(0.02)


def _child_with_args(wanted: bytes) -> int | None:
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids = [int(p) for p in f.read().split()]
        except (OSError, ValueError):
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read().rstrip(b"\0") == wanted:
                        return pid
            except OSError:
                continue
    return None


def process_cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 for None or unreadable)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


class Delay(keras.layers.Layer):
    """Sleeps ``seconds`` in every forward pass, then passes its input on: a worker that
    waits (a lock, a device, a remote call) rather than computes. 0: nothing at all."""

    def __init__(self, seconds: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seconds = float(seconds)

    def call(self, x: Any) -> Any:
        if not self.seconds:
            return x
        seconds = self.seconds
        done = tf.py_function(lambda: time.sleep(seconds) or np.float32(0), [], tf.float32)
        with tf.control_dependencies([done]):
            return tf.identity(x)

    def compute_output_shape(self, input_shape: Any) -> Any:
        return input_shape


def input_shape(spec: dict[str, Any]) -> tuple[int, ...]:
    """One example's shape: ``(input_dim,)`` for the mlp, ``(size, size, 3)`` for the convnet,
    the digits' ``(8, 8, 1)`` for the cnn."""
    if spec.get("model", "mlp") == "cnn":
        return DIGITS_SHAPE
    if spec.get("model", "mlp") == "convnet":
        return (int(spec["image_size"]), int(spec["image_size"]), 3)
    return (int(spec["input_dim"]),)


def build_model(spec: dict[str, Any], delay_s: float = 0.0) -> keras.Model:
    """The compute-bound model every side trains (``spec["model"]``), behind a `Delay` of
    ``delay_s`` (the same layers and variables on every worker, delayed or not)."""
    shape = input_shape(spec)
    if spec.get("model", "mlp") == "cnn":  # tfdist train --model=cnn's
        base = tfdist.models.get("cnn", input_shape=shape, num_classes=spec["num_classes"])
    elif spec.get("model", "mlp") == "convnet":
        base = tfdist.models.get(
            "convnet",
            input_shape=shape,
            num_classes=spec["num_classes"],
            filters=tuple(spec["filters"]),
        )
    else:
        base = tfdist.models.get(
            "mlp",
            input_shape=shape,
            num_classes=spec["num_classes"],
            hidden_units=tuple(spec["hidden_units"]),
            dropout=0.0,
        )
    inputs = keras.Input(shape)
    return keras.Model(inputs, base(Delay(delay_s, name="delay")(inputs)), name="balance_model")


def dataset_fn(spec: dict[str, Any]) -> Any:
    """Synthetic global batches, the same on every worker; each pipeline takes its shard. The
    cnn trains on the digits, as ``tfdist train --dataset=digits`` does."""
    g = int(spec["global_batch_size"])
    if spec.get("model") == "cnn":
        return tfdist.data.load("digits", split="train")

    def make(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        rng = np.random.default_rng(0)
        n = g * NUM_BATCHES
        x = rng.normal(size=(n, *input_shape(spec))).astype("float32")
        y = rng.integers(0, spec["num_classes"], size=(n,)).astype("int32")
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(
            input_context.num_input_pipelines, input_context.input_pipeline_id
        )
        batch = input_context.get_per_replica_batch_size(g)
        return ds.batch(batch, drop_remainder=True).cache().repeat().prefetch(2)

    return make


def local_rate(spec: dict[str, Any]) -> float:
    """This worker's examples/s on a local copy of the model, half the global batch a step."""
    model = build_model(spec)
    optimizer = make_optimizer(spec)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    n = int(spec["global_batch_size"]) // 2
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(n, *input_shape(spec))).astype("float32"))
    y = tf.constant(rng.integers(0, spec["num_classes"], size=(n,)).astype("int32"))

    @tf.function
    def step() -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step().numpy()  # traces
    steps = int(spec["rate_steps"])
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    loss.numpy()
    return n * steps / (time.perf_counter() - start)


class SplitLog(logging.Handler):
    """Keeps each ``Balance:`` line the chief logs, with its wall time."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Balance:"):
            self.lines.append((time.perf_counter(), message))


#: The yardstick: a chain of this many 128x128 matmuls (about 3 ms of CPU on the AMD EPYC).
YARDSTICK_MATMULS = 40


@tf.function
def _yardstick_chain(a: tf.Tensor) -> tf.Tensor:
    x = a
    for _ in range(YARDSTICK_MATMULS):
        x = tf.matmul(x, a)
    return tf.reduce_sum(x)


def yardstick_cpu_seconds(runs: int = 3) -> float:
    """CPU seconds of one fixed piece of compute (the least of ``runs``): this core's speed
    now. The same work costs more CPU while the host's other tenants share the core's caches
    or clock, which ``/proc/stat`` does not show, so the A/B sides read a fit's CPU per update
    against it (`tfdist.bench.balance.ab`)."""
    a = tf.fill((128, 128), 1.0 / 128.0)
    best = float("inf")
    for _ in range(runs):
        start = time.process_time()
        _yardstick_chain(a).numpy()
        best = min(best, time.process_time() - start)
    return best


class EpochClock(keras.callbacks.Callback):
    """At each epoch's end: wall time, own CPU, the hog's CPU and the machine's busy CPU.

    With ``yardstick``, also the yardstick's CPU (`yardstick_cpu_seconds`, ``yard_cpu``),
    timed after the clocks are read, and the wall and CPU the yardsticks took before this row
    (``yard_spent_s``, ``yard_spent_cpu``): ``t`` and ``cpu`` stay the real clocks, and the
    reader takes the yardsticks' own time out of a fit's (`tfdist.bench.balance.ab`)."""

    def __init__(self, hog_pid: int | None, yardstick: bool = False) -> None:
        super().__init__()
        self.hog_pid = hog_pid
        self.yardstick = yardstick
        self.rows: list[dict[str, Any]] = []
        self._spent = (0.0, 0.0)  # the yardsticks' wall and CPU so far

    def mark(self) -> None:
        row = {
            "t": time.perf_counter(),
            "cpu": time.process_time(),
            "hog_cpu": process_cpu_seconds(self.hog_pid),
            "busy_cpu": timing.busy_cpu_seconds(),
        }
        if self.yardstick:
            row["yard_spent_s"], row["yard_spent_cpu"] = self._spent
            wall, cpu = time.perf_counter(), time.process_time()
            row["yard_cpu"] = yardstick_cpu_seconds()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            self._spent = (self._spent[0] + wall, self._spent[1] + cpu)
        self.rows.append(row)

    def on_train_begin(self, logs: Any = None) -> None:
        self.mark()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.mark()
        if len(self.rows) % 5 == 0:
            report_progress(f"epoch {len(self.rows) - 1}/{self.params.get('epochs')}")


def make_optimizer(spec: dict[str, Any]) -> keras.optimizers.Optimizer:
    """``spec["optimizer"]`` (sgd or adam) at ``spec["learning_rate"]``."""
    if spec.get("optimizer", "sgd") == "adam":
        return keras.optimizers.Adam(spec["learning_rate"])
    return keras.optimizers.SGD(spec["learning_rate"])


def make_trainer(strategy: tf.distribute.Strategy, spec: dict[str, Any]) -> Any:
    """A Trainer on ``strategy`` for ``spec``'s model, balanced or not (``spec["balance"]``)."""
    balance: Any = False
    if spec["balance"]:
        balance = tfdist.BalanceOptions(window=int(spec["window"]))
    delay = float(spec.get("latency_s", 0.0)) if is_slowed(spec) else 0.0
    return tfdist.Trainer(
        fits.seeded(lambda: build_model(spec, delay)),
        strategy=strategy,
        steps_per_execution=spe if (spe := spec["steps_per_execution"]) == "auto" else int(spe),
        optimizer=make_optimizer(spec),
        loss=fits.logits_loss(),
        balance=balance,
    )


def fit_once(
    trainer: Any, spec: dict[str, Any], hog_pid: int | None, epochs: int, yardstick: bool = False
) -> dict:
    """One fit of ``epochs`` epochs; the epochs' clocks (with the yardstick's, `EpochClock`)
    and the chief's split lines (their times from the fit's start)."""
    clock = EpochClock(hog_pid, yardstick)
    splits = SplitLog()
    logging.getLogger("tfdist.training.balance.balancer").addHandler(splits)
    try:
        trainer.fit(
            dataset_fn(spec),
            global_batch_size=int(spec["global_batch_size"]),
            epochs=epochs,
            steps_per_epoch=int(spec["steps_per_epoch"]),
            callbacks=[clock],
            verbose=0,
        )
    finally:
        logging.getLogger("tfdist.training.balance.balancer").removeHandler(splits)
    start = clock.rows[0]["t"]
    return {
        "epochs": clock.rows,
        "splits": [{"t": t - start, "line": line} for t, line in splits.lines],
        "start_t": start,
        "hog_cpu_read": clock.hog_pid is not None,
    }


def train(strategy: tf.distribute.Strategy, spec: dict[str, Any], hog: Any) -> dict[str, Any]:
    """One fit on ``strategy``, balanced or not; the epochs' clocks and the chief's splits."""
    hog_pid = None if hog is None else host_pid(hog)
    return fit_once(make_trainer(strategy, spec), spec, hog_pid, int(spec["epochs"]))


def is_slowed(spec: dict[str, Any]) -> bool:
    """Whether this task is the worker that the side slows (the hog's, or the delayed one)."""
    task_type, task_id = task()
    return task_type == "worker" and task_id == int(spec["hog_worker"])


def _hog_if_mine(spec: dict[str, Any]) -> Any:
    """This task's hog: on the slowed worker, or on every one (``spec["hog_all"]``: a busy
    host, every core shared)."""
    if spec["hog"] and (spec.get("hog_all") or is_slowed(spec)):
        return start_hog(os.sched_getaffinity(0))
    return None


def stop_hog(hog: Any) -> None:
    if hog is not None:
        hog.kill()
        hog.wait()


def run_mwms(spec: dict[str, Any]) -> dict[str, Any]:
    """MultiWorkerMirrored: every worker measures its rate, then trains and records epochs."""
    hog = _hog_if_mine(spec)
    try:
        strategy = tfdist.make_strategy("multi_worker")
        rate = local_rate(spec)
        report_progress(f"local rate {rate:.0f} examples/s")
        result = train(strategy, spec, hog)
    finally:
        stop_hog(hog)
    return {**result, "local_examples_per_s": rate, "hog": hog is not None}


def run_ps(spec: dict[str, Any]) -> dict[str, Any] | None:
    """ParameterServerStrategy: the chief trains and records; workers (one with the hog) serve."""
    hog = _hog_if_mine(spec)
    try:
        strategy = tfdist.make_strategy("parameter_server")
        return {**train(strategy, {**spec, "balance": False}, None), "hog": spec["hog"]}
    finally:
        stop_hog(hog)


#: The A/B sides' modes, in their first round's order (reversed in the next, and so on).
AB_MODES = ("even", "balanced")


def run_ab(spec: dict[str, Any]) -> dict[str, Any]:
    """The A/B sides: one Trainer per mode (`AB_MODES`, the same model from the same seed) on
    one MultiWorkerMirrored strategy, their fits alternated (even, balanced; balanced, even;
    ...) over ``spec["ab_rounds"]`` rounds of ``spec["ab_epochs"]`` epochs each; per fit its
    epochs' clocks with the yardstick's (`EpochClock`) and the chief's split lines. With
    ``spec["hog_all"]`` every worker runs beside a hog on its own core the whole launch (a
    busy host)."""
    hog = _hog_if_mine(spec)
    try:
        strategy = tfdist.make_strategy("multi_worker")
        trainers = {
            mode: make_trainer(strategy, {**spec, "balance": mode == "balanced"})
            for mode in AB_MODES
        }
        hog_pid = None if hog is None else host_pid(hog)
        yardstick_cpu_seconds(1)  # traced before the first fit's clock
        rounds, fits_done = int(spec["ab_rounds"]), []
        for r in range(rounds):
            for mode in AB_MODES if r % 2 == 0 else AB_MODES[::-1]:
                report_progress(f"A/B round {r + 1}/{rounds}: {mode}")
                fit = fit_once(trainers[mode], spec, hog_pid, int(spec["ab_epochs"]), True)
                fits_done.append({"mode": mode, "round": r, **fit})
    finally:
        stop_hog(hog)
    return {"fits": fits_done, "hog": hog is not None}
