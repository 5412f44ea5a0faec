"""What each task of ``tfdist bench --benchmarks=stragglers`` runs (its parent: ``parent.py``).

Every side trains the same ``tfdist.Trainer`` (the CNN on scikit-learn's 8x8
digits, SGD) through the same ``dataset_fn``: the digits pipeline followed by a
per-batch sleep on one worker. The *balanced* side sleeps 0 s everywhere; the
*straggler* side sleeps ``delay_s`` per batch on worker ``straggler`` only.
The sleep is TF's ``SleepDataset`` kernel placed after the pipeline's own
prefetch: it runs on the worker itself, uses no CPU and calls no Python.
The distributed iterator still fetches one batch ahead, so the sleep overlaps
the step: a worker that sleeps ``d`` per batch takes a batch every
``max(T, d)`` seconds, ``T`` its unslowed step period (measured: with
``d = T`` the synchronous step did not slow at all; with ``d = 3T`` it took
``d``, not ``T + d``).

``delay_s`` is sized from this run: after a warm-up, balanced measurements (the
faster of two) give ``T``, and ``delay_s = factor * T``, so that worker takes
a batch every ``factor * T``.
Under MultiWorkerMirroredStrategy ``T`` is the step time (every worker takes
every step). Under ParameterServerStrategy the coordinator hands each step to
whichever worker is free, so a worker's period is ``workers`` times the
cluster's step time. The sides then alternate,
``repeats`` rounds of ``steps`` steps each, counting the optimizer updates.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

import tfdist
from tfdist.bench.harness import fits
from tfdist.bench.harness.worker_common import Recorder
from tfdist.bench.scaling.sides import Side, fit_side

CALIBRATION_RUNS = 2
WorkerIndex = Callable[[tf.distribute.InputContext], Any]


def sleep_each_element(dataset: tf.data.Dataset, microseconds: Any) -> tf.data.Dataset:
    """``dataset`` with a sleep of ``microseconds`` (int64, may be a tensor) before each element.

    TF's ``SleepDataset`` kernel, through public endpoints (``tf.raw_ops`` and
    ``tf.data.experimental.to_variant``/``from_variant``): it runs wherever the
    dataset runs, a remote parameter-server worker included.
    """
    flat = tf.nest.flatten(dataset.element_spec)
    variant = tf.raw_ops.SleepDataset(
        input_dataset=tf.data.experimental.to_variant(dataset),
        sleep_microseconds=tf.cast(microseconds, tf.int64),
        output_types=[spec.dtype for spec in flat],
        output_shapes=[spec.shape for spec in flat],
    )
    return tf.data.experimental.from_variant(variant, dataset.element_spec)


def straggler_dataset_fn(
    base: Callable[[tf.distribute.InputContext], tf.data.Dataset],
    *,
    delay_s: float,
    straggler: int,
    worker_index: WorkerIndex,
) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """``base``'s batches, repeated, with ``delay_s`` of sleep per batch on worker ``straggler``.

    Runs outside replica context, once per input pipeline (worker).

    Args:
        base: A bound ``dataset_fn`` of per-replica batches.
        delay_s: Seconds of sleep before each batch on the straggler (0: balanced).
        straggler: The index of the worker that sleeps.
        worker_index: This pipeline's worker, from its InputContext (a Python int or a
            scalar tensor).
    """
    microseconds = int(round(delay_s * 1e6))

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        here = tf.cast(worker_index(input_context), tf.int64)
        sleep = tf.where(tf.equal(here, straggler), tf.constant(microseconds, tf.int64), 0)
        return sleep_each_element(base(input_context).repeat(), sleep)

    return dataset_fn


def mwms_worker_index(input_context: tf.distribute.InputContext) -> int:
    """Under MWMS each worker has one input pipeline, numbered as the worker."""
    return input_context.input_pipeline_id


def ps_worker_index(input_context: tf.distribute.InputContext) -> tf.Tensor:
    """Under PS every worker's InputContext is (1, 0): the coordinator's worker index instead.

    Outside a ``tf.function`` (the Trainer reads the dataset's structure eagerly on the
    coordinator, where no worker runs it) it is -1, no worker.
    """
    del input_context
    if not tf.inside_function():
        return -1
    return tf.distribute.coordinator.experimental_get_current_worker_index()


def _trainer(
    strategy: tf.distribute.Strategy, spec: dict[str, Any], workers: int
) -> tuple[Any, Any, int]:
    """The Trainer every side shares, the bound digits dataset_fn and the global batch size."""
    global_batch_size = int(spec["per_worker_batch_size"]) * workers
    base = tfdist.data.load("digits", split="train").bind(global_batch_size=global_batch_size)
    builder = fits.seeded(
        lambda: tfdist.models.get("cnn", input_shape=base.input_shape, num_classes=base.num_classes)
    )
    trainer = tfdist.Trainer(
        builder,
        strategy=strategy,
        optimizer=keras.optimizers.SGD(spec["learning_rate"]),
        loss=fits.logits_loss(),
    )
    return trainer, base, global_batch_size


def measure(
    strategy: tf.distribute.Strategy,
    spec: dict[str, Any],
    *,
    workers: int,
    worker_index: WorkerIndex,
    period_per_step: int,
) -> dict[str, Any]:
    """Calibrates the delay, then times the balanced and straggler sides alternately.

    Args:
        strategy: The strategy of this task.
        spec: The benchmark's spec (``tfdist.bench.stragglers.parent``).
        workers: Worker processes.
        worker_index: How a ``dataset_fn`` finds its worker.
        period_per_step: A worker's unslowed step period in cluster steps (1 for MWMS,
            ``workers`` for PS).
    """
    trainer, base, global_batch_size = _trainer(strategy, spec, workers)
    steps, repeats = int(spec["steps"]), int(spec["repeats"])
    straggler, factor = int(spec["straggler"]), float(spec["factor"])

    def side(delay_s: float) -> Side:
        data = straggler_dataset_fn(
            base, delay_s=delay_s, straggler=straggler, worker_index=worker_index
        )
        made = fit_side(
            lambda **kw: trainer.fit(data, global_batch_size=global_batch_size, **kw),
            lambda: trainer.model.optimizer,
            steps,
            global_batch_size,
        )
        made.run(steps)  # untimed: traces, starts the pipelines
        return made

    recorder = Recorder(planned={"calibration": CALIBRATION_RUNS})
    sides = {"balanced": side(0.0)}
    # The faster of two balanced measurements: the one other processes disturbed least.
    calibration = [
        recorder.measure("calibration", lambda: sides["balanced"].run(steps))[0]
        for _ in range(CALIBRATION_RUNS)
    ]
    unslowed_step_s = min(calibration) / steps * period_per_step
    delay_s = factor * unslowed_step_s  # overlaps the step: the worker's period is max(T, d)
    sides["straggler"] = side(delay_s)
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    updates: dict[str, list[int]] = {name: [] for name in sides}
    for r in range(repeats):
        for name in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            before = sides[name].updates()
            took, _ = recorder.measure(name, lambda s=sides[name]: s.run(steps))
            seconds[name].append(took)
            updates[name].append(sides[name].updates() - before)
    return {
        "num_workers": workers,
        "global_batch_size": global_batch_size,
        "steps": steps,
        "seconds": seconds,
        "updates": updates,
        "records": recorder.records,
        "injected": {
            "worker": f"worker-{straggler}",
            "factor": factor,
            "seconds_per_batch": delay_s,
            "unslowed_worker_step_s": unslowed_step_s,
            "calibration_s": calibration,
            "calibration_steps": steps,
            "worker_step_in_cluster_steps": period_per_step,
        },
    }


def batches_drawn_per_worker(
    strategy: tf.distribute.Strategy,
    dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset],
    *,
    calls: int,
    workers: int,
) -> dict[str, int]:
    """Under PS: ``calls`` closures that each draw one batch; how many each worker ran.

    A check that the sleep landed on one worker: the coordinator hands a closure
    to whichever worker is free, so a slowed worker draws fewer.
    """
    from tfdist.strategies.ps.runner import coordinator_for

    coordinator = coordinator_for(strategy)

    def tagged(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        here = ps_worker_index(input_context)
        return dataset_fn(input_context).map(lambda x, y: here)

    per_worker = coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(tagged)
    )
    iterator = iter(per_worker)

    @tf.function
    def draw(iterator: Any) -> Any:
        return strategy.run(tf.identity, args=(next(iterator),))

    results = [coordinator.schedule(draw, args=(iterator,)) for _ in range(calls)]
    coordinator.join()
    counts = Counter(int(r.fetch()) for r in results)
    return {f"worker-{i}": counts.get(i, 0) for i in range(workers)}


def run_mwms(spec: dict[str, Any]) -> dict[str, Any]:
    """MultiWorkerMirroredStrategy: every worker times both sides (the straggler sleeps)."""
    strategy = tfdist.make_strategy("multi_worker")
    return measure(
        strategy,
        spec,
        workers=strategy.num_replicas_in_sync,
        worker_index=mwms_worker_index,
        period_per_step=1,
    )


def run_ps(spec: dict[str, Any]) -> dict[str, Any]:
    """ParameterServerStrategy: the chief times both sides; workers and ps serve (never return)."""
    strategy = tfdist.make_strategy("parameter_server")
    workers = int(spec["workers"])
    result = measure(
        strategy, spec, workers=workers, worker_index=ps_worker_index, period_per_step=workers
    )
    trainer_base = tfdist.data.load("digits", split="train").bind(
        global_batch_size=result["global_batch_size"]
    )
    result["batches_drawn_per_worker"] = {
        name: batches_drawn_per_worker(
            strategy,
            straggler_dataset_fn(
                trainer_base,
                delay_s=delay_s,
                straggler=int(spec["straggler"]),
                worker_index=ps_worker_index,
            ),
            calls=int(spec["steps"]),
            workers=workers,
        )
        for name, delay_s in (
            ("balanced", 0.0),
            ("straggler", result["injected"]["seconds_per_batch"]),
        )
    }
    return result
