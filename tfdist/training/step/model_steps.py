"""A model's own ``train_step`` / ``test_step`` / ``predict_step``, run as Keras's fit runs them.

When a model overrides one of these (the Keras guide "Customizing what happens
in fit()"), the Trainer calls the user's method as the replica step, exactly as
Keras's own loop does under ``tf.distribute``: once per batch, in replica
context. Its ``self.compute_loss`` divides the local loss by the replica count
and its ``self.optimizer.apply(...)`` all-reduces the gradients (one all-reduce
per ``apply``, so one per update for one optimizer; a GAN's two optimizers each
reduce their own). So N replicas on batch ``b`` give the gradients of one
replica on ``N * b``, as under Keras's ``fit``; and, unlike Keras's ``fit``, also
for a masked loss (`globally_counted_masks`).

What tfdist adds on top of a user's step must not silently not happen:
accumulation, 16-bit or bucketed exchange live in tfdist's own step, so they
are refused with a custom ``train_step`` (`check_custom_train_step`).

Logs, as Keras's fit makes them: on the sync strategies, the dict the user's
``train_step`` returns for the last batch of a call, averaged over the replicas
(equal to one device's logs when replicas see equal batches; a partial batch
weighs as much as a full one, as under Keras). Under parameter_server each step
runs on one replica, so the logs are the model's metrics (``model.metrics``),
summed exactly over all steps; there, and for a ``test_step`` on every
strategy (evaluation counts each example once), each returned key must name a
metric whose result it is: anything else is a clear error, never a wrong log
(see `checked_logs`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from tfdist._compat.keras_internals.masks import masked_terms
from tfdist.config import invalid_argument
from tfdist.training.step.exchange import sum_counts

STEPS = ("train_step", "test_step", "predict_step")


def _from_keras(cls: type) -> bool:
    return cls.__module__.split(".")[0] == "keras"


def overridden(model: keras.Model, method: str) -> bool:
    """Whether a user class (not Keras itself) in ``model``'s MRO defines ``method``."""
    return any(method in vars(c) for c in type(model).__mro__ if not _from_keras(c))


@dataclasses.dataclass(frozen=True)
class Overrides:
    """Which of Keras's step methods the model overrides."""

    train_step: bool = False
    test_step: bool = False
    predict_step: bool = False

    @classmethod
    def of(cls, model: keras.Model) -> Overrides:
        return cls(*(overridden(model, m) for m in STEPS))


def callable_model(model: keras.Model) -> bool:
    """Whether the model has a ``call`` (a GAN made of two models may have none)."""
    return overridden(model, "call") or not overridden(model, "train_step") or model.built


def build_optimizers(model: keras.Model) -> None:
    """Builds the optimizers of a model with no ``call`` on the variables of their parts.

    Optimizers make their slots on their first ``apply``; inside a distributed
    step that is too late (variables must be made in the scope, up front). Each
    optimizer set as a model attribute is built for the trainable variables of
    every sub-model, which covers the ones it will update.
    """
    optimizers = [o for o in vars(model).values() if isinstance(o, keras.optimizers.Optimizer)]
    if getattr(model, "optimizer", None) is not None:
        optimizers.append(model.optimizer)
    for optimizer in optimizers:
        if not optimizer.built:
            optimizer.build(model.trainable_variables)


def check_custom_train_step(model: keras.Model, *, accumulation_steps: int, exchange: Any) -> None:
    """Refuses tfdist features that live in tfdist's own step when the model has its own.

    A no-op for a model without its own ``train_step``. ``exchange``: the Trainer's
    ``ExchangeOptions`` (its compression, buckets and sharding; errors name their shortcuts).

    Raises:
        ValueError: Naming the feature and the model's ``train_step``.
    """
    if not overridden(model, "train_step"):
        return
    name = type(model).__name__
    note = (
        f"{name} overrides train_step(), which the Trainer runs as the replica step, as Keras's "
        "fit does; {what} happens inside tfdist's own step, which a custom train_step replaces. "
        "Remove the option, or remove the train_step override."
    )
    # (option, value given, the value a custom train_step needs, what tfdist's step does with it)
    for option, value, needed, what in (
        ("accumulation_steps", accumulation_steps, 1, "gradient accumulation"),
        ("gradient_compression", exchange.compression, None, "the 16-bit gradient exchange"),
        ("bucket_bytes", exchange.bucket_bytes, None, "the bucketed gradient exchange"),
        ("sharding", exchange.sharding, None, "sharding the optimizer state over the replicas"),
    ):
        if value != needed:
            raise invalid_argument(
                option,
                value,
                f"{needed} for a model with its own train_step",
                note=note.format(what=what),
            )


def _metric_results(model: keras.Model) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for metric in model.metrics:
        value = metric.result()
        results.update(value if isinstance(value, dict) else {metric.name: value})
    return results


def checked_logs(model: keras.Model, method: str, logs: Any) -> list[str]:
    """The log keys of a user step's returned ``logs``; asserts each is its metric's result.

    Runs in replica context right after the user's step. The check that a
    returned value equals the metric's local result runs in the graph (a
    ``tf.debugging`` assertion), so a step that returns, say, a raw loss under
    the name of the compiled ``loss`` tracker fails loudly instead of logging
    the tracker.

    Raises:
        ValueError: At trace time, if ``logs`` is not a dict of metric names.
    """
    expected = (
        "a dict of the model's metric results, e.g. {m.name: m.result() for m in self.metrics}"
    )
    fix = (
        "tfdist logs metrics reduced exactly over all replicas and workers; track other values "
        "in a keras.metrics.Mean (listed in the model's `metrics` property) and return its result."
    )
    if logs is None:
        return []
    if not isinstance(logs, Mapping):
        raise invalid_argument(f"{method}() return value", type(logs).__name__, expected, note=fix)
    results = _metric_results(model)
    unknown = sorted(set(logs) - set(results))
    if unknown:
        raise invalid_argument(
            f"{method}() return value",
            f"keys {unknown} that name no metric of the model (metrics: {sorted(results)})",
            expected,
            note=fix,
        )
    for key, value in logs.items():
        got = tf.cast(tf.convert_to_tensor(value), tf.float32)
        want = tf.cast(tf.convert_to_tensor(results[key]), tf.float32)
        tf.debugging.assert_near(
            got,
            want,
            rtol=1e-5,
            atol=1e-6,
            message=f"{method}() returned {key!r} that is not the result of the model's metric "
            f"{key!r}. {fix}",
        )
    return list(logs)


def _as_logs(method: str, logs: Any) -> dict[str, tf.Tensor]:
    """A user step's returned logs as float32 tensors, to average over the replicas."""
    if logs is None:
        return {}
    if not isinstance(logs, Mapping):
        raise invalid_argument(
            f"{method}() return value", type(logs).__name__, "a dict of logs, as Keras's fit takes"
        )
    return {k: tf.cast(tf.convert_to_tensor(v), tf.float32) for k, v in logs.items()}


def globally_counted_masks() -> contextlib.AbstractContextManager:
    """Within this block, a Keras loss's masked mean is over the valid count of all replicas.

    Keras divides a masked term (a Keras mask, ``ignore_class``) by the valid count
    of the replica's own batch, so its replicas' gradients summed are not one
    device's on the whole batch. Here each such term is ``sum / (D * N)`` instead, with
    ``D`` the count summed over the ``N`` replicas (one small all-reduce per term):
    a user's ``train_step`` then updates as one device on ``N * b`` examples. Runs in
    replica context; nothing changes with one replica.
    """
    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    if replicas == 1:
        return contextlib.nullcontext()

    def rescale(value: tf.Tensor, count: tf.Tensor) -> tf.Tensor:
        total = sum_counts(tf.reshape(count, [1]))[0]
        return value * tf.cast(tf.math.divide_no_nan(replicas * count, total), value.dtype)

    return masked_terms(rescale)


def make_custom_train_update(
    model: keras.Model, keys: list[str], *, averaged: bool
) -> Callable[[Sequence[Any]], Any]:
    """``update(batches)``: the model's own ``train_step`` on each batch, in replica context.

    Args:
        model: The model whose ``train_step`` runs.
        keys: Collects the log keys the step returns (filled at trace time).
        averaged: The runner averages the returned logs over the replicas (sync
            strategies, as Keras's fit does): ``update`` returns the last
            batch's logs. Else (parameter_server) the logs are the model's
            metrics, summed exactly, and the returned keys are checked to be
            metric results (`checked_logs`).
    """

    def update(micro_batches: Sequence[Any]) -> Any:
        logs: Any = None
        for data in micro_batches:
            with globally_counted_masks():
                logs = model.train_step(data)
            if not averaged:
                found = checked_logs(model, "train_step", logs)
                if not keys:
                    keys.extend(found or ["<none>"])
        return _as_logs("train_step", logs) if averaged else None

    return update


def make_custom_eval_step(model: keras.Model, keys: list[str]) -> Callable[[Sequence[Any]], None]:
    """``step(batches)``: the model's own ``test_step``, skipping empty batches (see step.py)."""

    def step(batches: Sequence[Any]) -> None:
        for data in batches:
            x = keras.utils.unpack_x_y_sample_weight(data)[0]
            first = next(t for t in tf.nest.flatten(x) if t is not None)

            def run(data=data):
                found = checked_logs(model, "test_step", model.test_step(data))
                if not keys:
                    keys.extend(found or ["<none>"])
                return tf.constant(True)

            tf.cond(tf.shape(first)[0] > 0, run, lambda: tf.constant(False))

    return step


def select_logs(logs: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """The logs a user step returned (``keys``), or all of them before its first trace."""
    if not keys:
        return dict(logs)
    if keys == ["<none>"]:
        return {}
    return {k: logs[k] for k in keys if k in logs}
