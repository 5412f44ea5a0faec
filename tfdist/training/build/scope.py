"""Building the model, its optimizer and its metrics into the strategy scope.

Every variable a distributed step touches must be created inside
``strategy.scope()``: the model's (see `tfdist.training.build.placement`), the
optimizer's slots and counters, the metrics' totals and the loss-scale
counters. Users often make the optimizer and metrics outside the scope, so
they are rebuilt from their configs inside it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import keras
import tensorflow as tf

from tfdist._compat.keras_internals.scope_moves import (
    copy_in_scope,
    optimizer_config,
    optimizer_copy_in_scope,
)
from tfdist.config import invalid_argument
from tfdist.models import check_output_keys
from tfdist.training.build import lr_schedules as schedules
from tfdist.training.build import precision as precision_lib
from tfdist.training.build.compiled import check_own_compile, compile_plan
from tfdist.training.build.placement import ModelOrBuilder, in_scope_or_refused, place_model
from tfdist.training.options import LRScaling

logger = logging.getLogger(__name__)

#: The arguments of ``keras.Model.compile`` that the Trainer takes (`compile_in_scope`).
COMPILE_ARGUMENTS = ("optimizer", "loss", "loss_weights", "metrics", "weighted_metrics")


def check_loss(loss: Any) -> None:
    """Raises the standard error for an unknown loss name (a missing one: see compiled.py)."""
    # A misspelt name would otherwise fail only at the first step, deep inside compile.
    expected = "a Keras loss, its name, or a callable(y_true, y_pred)"
    if isinstance(loss, str):
        try:
            keras.losses.get(loss)
        except ValueError:
            raise invalid_argument("loss", loss, expected) from None


@dataclasses.dataclass
class OptimizerParts:
    """An optimizer taken apart: its class, config, loss scaling, and the object to copy.

    ``config``'s ``learning_rate`` is the optimizer's own schedule object when it has one;
    ``live`` is the user's optimizer when it is not built yet (it is then copied, not rebuilt).
    """

    cls: type
    config: dict[str, Any]
    loss_scale: dict[str, Any] | None = None
    live: keras.optimizers.Optimizer | None = None

    def make(self, strategy: tf.distribute.Strategy) -> keras.optimizers.Optimizer:
        """The optimizer in ``strategy``'s scope, with ``config``'s rate and accumulation."""
        if self.live is None:
            optimizer = self.cls.from_config(self.config)
        else:
            optimizer = _copied(strategy, self.live)
            optimizer.gradient_accumulation_steps = self.config["gradient_accumulation_steps"]
            if isinstance(self.config["learning_rate"], schedules.ScaledWarmup):
                optimizer.learning_rate = self.config["learning_rate"]
        if self.loss_scale is not None:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer, **self.loss_scale)
        return optimizer


def _copied(
    strategy: tf.distribute.Strategy, optimizer: keras.optimizers.Optimizer
) -> keras.optimizers.Optimizer:
    name = type(optimizer).__name__
    return in_scope_or_refused(
        lambda: optimizer_copy_in_scope(strategy, optimizer),
        argument="optimizer",
        received=name,
        expected="a Keras optimizer that can be copied into the strategy scope",
        failed=f"copy {name} with its variables in the scope",
        fix="Make and compile the model in a builder, `Trainer(lambda: ..., strategy=...)`, or "
        "inside `with strategy.scope():`.",
    )


def optimizer_parts(optimizer: Any) -> OptimizerParts:
    """Takes apart an optimizer or its name (see `OptimizerParts`)."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        scale = {
            "initial_scale": float(optimizer.initial_scale),
            "dynamic_growth_steps": int(optimizer.dynamic_growth_steps),
        }
        return dataclasses.replace(optimizer_parts(optimizer.inner_optimizer), loss_scale=scale)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        try:
            optimizer = keras.optimizers.get(optimizer)
        except ValueError as e:
            raise invalid_argument(
                "optimizer", optimizer, "a Keras optimizer or its name, e.g. 'adam'"
            ) from e
    elif optimizer.built:
        logger.warning(
            "The optimizer was already built outside the strategy scope; tfdist "
            "rebuilds it from its config and its slot variables start afresh."
        )
    else:
        return OptimizerParts(type(optimizer), optimizer_config(optimizer), live=optimizer)
    return OptimizerParts(type(optimizer), optimizer_config(optimizer))


def take_keras_accumulation(opt_config: dict[str, Any], accumulation_steps: int) -> int:
    """Moves Keras's ``gradient_accumulation_steps`` (which fails under tf.distribute) to ours.

    Clears it in ``opt_config`` and returns the ``accumulation_steps`` to use.
    """
    keras_steps = opt_config.get("gradient_accumulation_steps")
    if not keras_steps:
        return accumulation_steps
    if accumulation_steps not in (1, keras_steps):
        raise invalid_argument(
            "accumulation_steps",
            accumulation_steps,
            f"1 or {keras_steps}",
            note=f"The optimizer also sets gradient_accumulation_steps={keras_steps}; set only "
            "Trainer(accumulation_steps=...).",
        )
    logger.info(
        "Using the optimizer's gradient_accumulation_steps=%d as "
        "Trainer(accumulation_steps=%d): Keras's own accumulation fails under "
        "tf.distribute (merge_call).",
        keras_steps,
        keras_steps,
    )
    opt_config["gradient_accumulation_steps"] = None
    return keras_steps


def _metric_in_scope(metric: Any, strategy: tf.distribute.Strategy, model: keras.Model) -> Any:
    """A ``Metric`` object as a copy with its variables in the scope; names and functions as is."""
    if not isinstance(metric, keras.metrics.Metric):
        return metric
    name = type(metric).__name__
    return in_scope_or_refused(
        lambda: copy_in_scope(strategy, metric, keep=model.variables),
        argument="metrics",
        received=name,
        expected="Keras metrics that can be copied into the strategy scope",
        failed=f"copy {name} with its variables in the scope",
        fix="Pass a builder that makes and compiles the model with its metrics, "
        "`Trainer(lambda: ..., strategy=...)`, or compile it inside `strategy.scope()`.",
    )


def _metrics_in_scope(metrics: Any, strategy: tf.distribute.Strategy, model: keras.Model) -> Any:
    """``compile``'s metrics (a list, a dict per output, or None), each Metric copied into scope."""
    if metrics is None:
        return None
    if isinstance(metrics, dict):
        return {name: _metrics_in_scope(m, strategy, model) for name, m in metrics.items()}
    if isinstance(metrics, (list, tuple)):
        return [_metrics_in_scope(m, strategy, model) for m in metrics]
    return _metric_in_scope(metrics, strategy, model)


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What `compile_in_scope` made.

    Attributes:
        model: The compiled model, its variables in the scope (built later if
            it was given unbuilt).
        accumulation_steps: Micro-batches per update, the optimizer's Keras
            ``gradient_accumulation_steps`` taken over.
        schedule: The learning-rate schedule wrapping the optimizer's rate
            when scaling or warmup is on, else None.
        skipped_updates: With loss scaling, the counter of updates skipped for
            non-finite gradients, else None.
        steps_per_execution: The ``steps_per_execution`` the user compiled the
            model with, when not Keras's default 1, else None.
    """

    model: keras.Model
    accumulation_steps: int
    schedule: schedules.ScaledWarmup | None
    skipped_updates: tf.Variable | None
    steps_per_execution: int | None = None


def model_precision(precision: Any, model: ModelOrBuilder, *, is_chief: bool) -> str:
    """The concrete policy for ``precision``; "auto" keeps a made model's own policy."""
    if precision == "auto" and isinstance(model, keras.Model):
        precision = model.dtype_policy.name  # a model already made keeps its policy
    # "auto" becomes a concrete policy; a policy the device runs slowly warns once (chief).
    return precision_lib.resolve_precision(precision, is_chief=is_chief)


def compile_in_scope(
    model: ModelOrBuilder,
    compile_arguments: Mapping[str, Any],
    *,
    strategy: tf.distribute.Strategy,
    precision: str,
    accumulation_steps: int,
    lr_scaling: LRScaling | None,
) -> Compiled:
    """Places ``model`` in ``strategy``'s scope and compiles it with a fresh optimizer and metrics.

    A model the user compiled gives its own compile arguments instead (see
    `tfdist.training.build.compiled`); one whose class overrides ``compile`` is
    used as compiled.

    Args:
        model: A ``keras.Model`` or a zero-arg builder.
        compile_arguments: ``optimizer``, ``loss``, ``metrics``, ``loss_weights`` and
            ``weighted_metrics`` as given to the Trainer (`COMPILE_ARGUMENTS`; a missing one is
            None). ``optimizer``: a Keras optimizer (made anywhere) or its name; None: the
            compiled one, else ``"adam"``. The others as for ``keras.Model.compile`` (metrics
            a list, or a dict per output).
        strategy: The strategy whose scope holds every variable.
        precision: A resolved dtype policy name (not ``"auto"``).
        accumulation_steps: ``k`` as given to the Trainer.
        lr_scaling: Scaling and warmup of the optimizer's learning rate, or None.
    """
    given = {name: compile_arguments.get(name) for name in COMPILE_ARGUMENTS}
    lr_active = lr_scaling is not None and lr_scaling.active
    if isinstance(model, keras.Model):
        check_own_compile(model, strategy, given)  # before placing: it moves the variables
    # Builders run under the policy, so their layers compute in the mixed dtype.
    with precision_lib.dtype_policy(precision), strategy.scope():
        placed = place_model(model, strategy, precision)
    original = model if isinstance(model, keras.Model) else placed
    args, compiled_steps = compile_plan(original, placed, strategy, given, lr_active=lr_active)
    if args is None:  # the model's own compile(), made in the scope: used as is
        return Compiled(placed, accumulation_steps, None, None)
    parts = optimizer_parts(args.pop("optimizer"))
    accumulation_steps = take_keras_accumulation(parts.config, accumulation_steps)
    schedule = None
    if lr_active:
        schedule = schedules.schedule_for(parts.config["learning_rate"], lr_scaling)
        parts.config["learning_rate"] = schedule
    with precision_lib.dtype_policy(precision), strategy.scope():
        check_output_keys(placed, **args)  # the optimizer was taken out above
        opt = precision_lib.wrap_optimizer(parts.make(strategy), precision)
        for key in ("metrics", "weighted_metrics"):
            args[key] = _metrics_in_scope(args[key], strategy, placed)
        placed.compile(optimizer=opt, **args)
        skipped_updates = _skip_counter(opt)
    return Compiled(placed, accumulation_steps, schedule, skipped_updates, compiled_steps)


def _skip_counter(optimizer: keras.optimizers.Optimizer) -> tf.Variable | None:
    """With loss scaling, the counter of skipped (non-finite) updates; call in the scope."""
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return None
    # Written after the all-reduce, where every replica takes the same skip decision:
    # one copy per replica that only the first replica's write sets.
    return tf.Variable(
        0,
        dtype=tf.int64,
        trainable=False,
        name="skipped_updates",
        synchronization=tf.VariableSynchronization.ON_WRITE,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )
