"""What each worker of ``tfdist bench --benchmarks=scaling`` runs (its parent: ``parent.py``).

Under MultiWorkerMirroredStrategy every worker builds the same sides from the same
initial weights and data: the Trainer (once per gradient-compression variant, and once
per local-SGD side: ``local_sgd_h<H>``, ``diloco_h<H>``), plain Keras ``model.fit`` and
a raw ``strategy.run`` loop (all steps in one ``tf.function``, one all-reduce per step).
It times them alternately, ``repeats`` rounds of ``steps`` steps each, counting the
optimizer updates each side really made. Then it measures the parts of a step apart, in
the same process (compute, gradient exchange and input alone). The sides and the parts
are built in ``tfdist.bench.scaling.sides``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

import tfdist
from tfdist.bench.harness import fits
from tfdist.bench.harness.worker_common import Recorder
from tfdist.bench.scaling.sides import (
    Side,
    build_model,
    fit_side,
    make_dataset,
    raw_loop_side,
    split_parts,
    time_parts,
    time_sides,
)


def trainer_kwargs(variant: str | None, bucket_bytes: int | None) -> dict[str, Any] | None:
    """The Trainer keywords of a variant, or None when this Trainer does not take them."""
    params = inspect.signature(tfdist.Trainer.__init__).parameters
    kwargs: dict[str, Any] = {}
    if variant not in (None, "none"):
        if "gradient_compression" not in params:
            return None
        kwargs["gradient_compression"] = variant
    if bucket_bytes is not None:
        if "bucket_bytes" not in params:
            return None
        kwargs["bucket_bytes"] = bucket_bytes
    return kwargs


def _trainer_sides(
    spec: dict[str, Any],
    strategy: tf.distribute.Strategy,
    builder: Callable[[], keras.Model],
    dataset: tf.data.Dataset,
    global_batch_size: int,
) -> tuple[dict[str, Side], dict[str, str]]:
    """A Trainer side per gradient-compression variant, and why any variant is unavailable."""
    sides: dict[str, Side] = {}
    unavailable: dict[str, str] = {}
    for variant in spec["gradient_compression"]:
        name = "trainer" if variant in (None, "none") else f"trainer_{variant}"
        kwargs = trainer_kwargs(variant, spec.get("bucket_bytes"))
        if kwargs is None:
            unavailable[name] = (
                "this tfdist.Trainer does not take gradient_compression/bucket_bytes"
            )
            continue
        try:
            sides[name] = _sgd_trainer_side(
                spec, strategy, builder, dataset, global_batch_size, **kwargs
            )
        except (TypeError, ValueError) as e:  # e.g. a variant this Trainer refuses on this machine
            unavailable[name] = f"{type(e).__name__}: {e}"
    return sides, unavailable


def _sgd_trainer_side(
    spec: dict[str, Any],
    strategy: tf.distribute.Strategy,
    builder: Callable[[], keras.Model],
    dataset: tf.data.Dataset,
    global_batch_size: int,
    *,
    from_epoch_begin: bool = True,  # "auto" stays what users get
    **kwargs: Any,
) -> Side:
    """The Trainer with SGD at ``spec["learning_rate"]`` and ``kwargs`` as a timed side."""
    trainer = tfdist.Trainer(
        builder,
        strategy=strategy,
        optimizer=keras.optimizers.SGD(spec["learning_rate"]),
        loss=fits.logits_loss(),
        metrics=list(spec["metrics"]),
        **kwargs,
    )
    return fit_side(
        lambda **kw: trainer.fit(dataset, global_batch_size=global_batch_size, **kw),
        lambda: trainer.model.optimizer,
        int(spec["steps"]),
        global_batch_size,
        from_epoch_begin=from_epoch_begin,
    )


def _local_sgd_sides(
    spec: dict[str, Any],
    strategy: tf.distribute.Strategy,
    builder: Callable[[], keras.Model],
    dataset: tf.data.Dataset,
    global_batch_size: int,
    syncs: dict[str, list[Any]],
) -> dict[str, Side]:
    """A Trainer side per ``spec["local_sgd"]`` name (SGD inside, as the ``trainer`` side), each
    fit's syncs appended to ``syncs[name]``: the multiples of H it passed (with ``_k<K>``: of
    ``H / K``, a fragment each), and one more when it ended between them (a fit ends on a sync);
    ``syncs[name + "/bytes"]`` each fit's all-reduced bytes, ``[scheduled syncs', its end's]``
    (`fits.sync_bytes`), and
    ``syncs[name + "/fragments"]`` each fragment's bytes (`fits.fragment_bytes`)."""
    sides: dict[str, Side] = {}
    for name in spec.get("local_sgd", ()):
        option = fits.local_sgd_option(name)
        side = _sgd_trainer_side(
            spec, strategy, builder, dataset, global_batch_size, local_sgd=option
        )
        pieces = fits.fragment_bytes(builder(), name)
        syncs[name], syncs[f"{name}/bytes"], syncs[f"{name}/fragments"] = [], [], pieces

        def run(n: int, side: Side = side, h: int = option.sync_every, name: str = name):
            before = side.updates()
            took = side.run(n)
            after = side.updates()
            pieces = syncs[f"{name}/fragments"]
            syncs[name].append(fits.syncs_between(before, after, h, len(pieces)))
            syncs[f"{name}/bytes"].append(list(fits.sync_bytes(before, after, h, pieces)))
            return took

        sides[name] = Side(run, side.updates)
    return sides


def _keras_fit_side(
    spec: dict[str, Any],
    strategy: tf.distribute.Strategy,
    builder: Callable[[], keras.Model],
    dataset: tf.data.Dataset,
    global_batch_size: int,
) -> Side:
    """Plain Keras ``model.fit`` on a model compiled in the strategy's scope."""
    rate = spec["learning_rate"]
    model = fits.compiled_in_scope(
        strategy, builder, lambda: keras.optimizers.SGD(rate), spec["metrics"]
    )
    return fit_side(
        lambda **kw: model.fit(dataset, shuffle=False, **kw),
        lambda: model.optimizer,
        int(spec["steps"]),
        global_batch_size,
    )


def run_mwms(spec: dict[str, Any]) -> dict[str, Any]:
    """Times every side and the step parts on this worker.

    Returns seconds, steps and updates per measurement.
    """
    strategy = tfdist.make_strategy("multi_worker")
    workers = strategy.num_replicas_in_sync
    b = int(spec["per_worker_batch_size"])
    global_batch_size = b * workers
    steps, repeats = int(spec["steps"]), int(spec["repeats"])
    dataset = make_dataset(spec, global_batch_size)
    keras.utils.set_random_seed(0)
    weights = build_model(spec).get_weights()
    builder = fits.with_weights(lambda: build_model(spec), weights)
    sides, unavailable = _trainer_sides(spec, strategy, builder, dataset, global_batch_size)
    syncs: dict[str, list[int]] = {}
    sides.update(_local_sgd_sides(spec, strategy, builder, dataset, global_batch_size, syncs))
    sides["keras_fit"] = _keras_fit_side(spec, strategy, builder, dataset, global_batch_size)
    for variant in spec["gradient_compression"]:
        name = "raw_loop" if variant in (None, "none") else f"raw_loop_{variant}"
        compression = None if variant == "none" else variant
        sides[name] = raw_loop_side(
            strategy,
            lambda: build_model(spec),
            weights,
            strategy.experimental_distribute_dataset(dataset),
            global_batch_size=global_batch_size,
            learning_rate=spec["learning_rate"],
            compression=compression,
        )
    recorder = Recorder()
    seconds, updates = time_sides(sides, recorder, steps, repeats)
    parts = {}
    for variant in spec["gradient_compression"]:
        key = "none" if variant in (None, "none") else variant
        compression = None if key == "none" else key
        step_parts = split_parts(strategy, spec, weights, dataset, b, compression)
        parts[key] = time_parts(step_parts, recorder, steps, repeats)
    return {
        "num_workers": workers,
        "global_batch_size": global_batch_size,
        "steps": steps,
        "seconds": seconds,
        "updates": updates,
        "parts_s_per_step": parts,
        "unavailable": unavailable,
        # Per local side, each timed fit's syncs (the first, the untimed warm-up, left out).
        "syncs": {name: log[1:] for name, log in syncs.items() if "/" not in name},
        "sync_bytes": {
            n[: -len("/bytes")]: b[1:] for n, b in syncs.items() if n.endswith("/bytes")
        },
        "fragment_bytes": {
            n[: -len("/fragments")]: b for n, b in syncs.items() if n.endswith("/fragments")
        },
        "gradient_bytes": int(sum(w.size for w in weights) * 4),
        "records": recorder.records,
    }


def run_ps(spec: dict[str, Any]) -> dict[str, Any] | None:
    """Parameter-server side: the chief times the Trainer.

    Workers and ps serve (this call never returns there).
    """
    strategy = tfdist.make_strategy("parameter_server")  # workers and ps serve here until stopped
    workers = int(spec["ps_workers"])
    b = int(spec["per_worker_batch_size"])
    global_batch_size = b * workers
    steps, repeats = int(spec["steps"]), int(spec["repeats"])
    dataset = make_dataset(spec, global_batch_size)
    keras.utils.set_random_seed(0)
    builder = fits.with_weights(lambda: build_model(spec), build_model(spec).get_weights())
    side = _sgd_trainer_side(
        spec, strategy, builder, dataset, global_batch_size, from_epoch_begin=False
    )
    recorder = Recorder()
    side.run(steps)
    seconds, updates = [], []
    for _ in range(repeats):
        before = side.updates()
        took, _ = recorder.measure("trainer_ps", lambda: side.run(steps))
        seconds.append(took)
        updates.append(side.updates() - before)
    return {
        "num_workers": workers,
        "global_batch_size": global_batch_size,
        "steps": steps,
        "seconds": {"trainer_ps": seconds},
        "updates": {"trainer_ps": updates},
        "records": recorder.records,
    }
