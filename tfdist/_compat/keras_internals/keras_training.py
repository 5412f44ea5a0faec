"""The Keras and TF internals that tfdist's training code uses, each behind one named function.

``tfdist/training`` calls only these functions, so a Keras upgrade that moves
one of them breaks here, in one place, with a name that says what was needed.
Where Keras has a public equivalent, tfdist uses that instead (e.g.
``keras.utils.unpack_x_y_sample_weight``, ``model.compute_loss``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf


def symbolic_build(model: keras.Model, data_batch: Any, *, build_optimizer: Any = None) -> None:
    """Builds a compiled model, its metrics and its optimizer from a batch spec, as ``fit`` does.

    Call it inside the strategy scope, so that every variable is created there.
    ``build_optimizer(trainable_variables)``, if given, builds the (unbuilt) optimizer instead
    of Keras's ``optimizer.build`` (sharded optimizer state builds it on blocks).
    """
    optimizer = model.optimizer
    if build_optimizer is not None and optimizer is not None and not optimizer.built:

        def build(variables: Any) -> None:
            del optimizer.build  # the class's own again, for build_optimizer to call
            build_optimizer(variables)

        optimizer.build = build
    try:
        # Private: public model.build() builds only the layers; this also builds the compiled
        # metrics and the optimizer's slots, which must be created in the scope before the step
        # is traced.
        model._symbolic_build(data_batch=data_batch)
    finally:
        if optimizer is not None:
            optimizer.__dict__.pop("build", None)


def loss_tracker(model: keras.Model) -> keras.metrics.Metric:
    """The ``Mean`` metric behind a compiled model's ``loss`` log."""
    # Private: Keras keeps its running loss mean only here; train_step updates it by this name.
    return model._loss_tracker


def output_loss_trackers(model: keras.Model) -> list[keras.metrics.Metric]:
    """The ``Mean`` metrics behind a compiled model's per-output ``<output>_loss`` logs.

    Empty for a model with one loss (or no compiled loss).
    """
    # Private: Keras's CompileLoss keeps them only here; it makes them when it is first built.
    compile_loss = getattr(model, "_compile_loss", None)
    return list(getattr(compile_loss, "metrics", None) or [])


@contextlib.contextmanager
def recorded_updates(
    metrics: list[keras.metrics.Metric],
) -> Iterator[list[tuple[keras.metrics.Metric, Any]]]:
    """Within this block, ``metric.update_state(value, ...)`` records ``(metric, value)`` instead.

    The caller then updates each metric itself, with a weight of its own.
    """
    recorded: list[tuple[keras.metrics.Metric, Any]] = []

    def recorder(metric: keras.metrics.Metric) -> Any:
        def update_state(values: Any, sample_weight: Any = None) -> None:
            recorded.append((metric, values))

        return update_state

    for metric in metrics:
        # An instance attribute shadows the method; object.__setattr__ skips Keras's tracking.
        object.__setattr__(metric, "update_state", recorder(metric))
    try:
        yield recorded
    finally:
        for metric in metrics:
            metric.__dict__.pop("update_state", None)


def unscale_loss(loss: tf.Tensor) -> tf.Tensor:
    """Undoes the division by the replica count that ``model.compute_loss`` applies in a replica.

    Gives the loss value that Keras's ``loss`` metric tracks, so the logs read
    as ``model.fit``'s do on every strategy.
    """
    # Private: Keras's own inverse of the scaling inside compute_loss, so the pair stays matched.
    from keras.src.losses.loss import unscale_loss_for_distribution

    return unscale_loss_for_distribution(loss)


def concrete_functions(function: Any) -> list[Any]:
    """Every concrete function a ``tf.function`` has traced so far (to inspect graphs in tests)."""
    # Private: TF lists a tf.function's traces only here (get_concrete_function needs a signature).
    return list(function._list_all_concrete_functions())


def compile_arguments(model: keras.Model) -> dict[str, Any]:
    """The arguments a model's ``compile(...)`` received, as the objects given (not serialized).

    Keys: ``optimizer``, ``loss``, ``loss_weights``, ``metrics``,
    ``weighted_metrics``, ``run_eagerly``, ``steps_per_execution``,
    ``jit_compile``. Empty for a model never compiled.
    """
    # Private: Keras keeps compile's own arguments only here; the public get_compile_config()
    # serializes them, which fails for plain-function losses and copies metric objects anyway.
    config = getattr(model, "_compile_config", None)
    return dict(config.config) if config is not None and model.compiled else {}


def metrics_in_order(model: keras.Model, logs: dict[str, Any]) -> Any:
    """``logs`` as ``model.evaluate`` returns them without ``return_dict``: a list, or one value."""
    # Private: Keras orders evaluate's list by its compiled metrics here, and has no public twin.
    return model._flatten_metrics_in_order(logs)


def variable_key(optimizer: keras.optimizers.Optimizer, variable: Any) -> Any:
    """The key by which ``optimizer`` knows ``variable`` (weight-decay exclusions, slots)."""
    # Private: Keras keys an optimizer's variables by this function's result only.
    return optimizer._var_key(variable)


def weight_decay_exclusions(optimizer: keras.optimizers.Optimizer) -> set | None:
    """The keys of the variables excluded from weight decay by object, or None (none given)."""
    # Private: exclude_from_weight_decay(var_list=...) keeps the variables' keys only here.
    return getattr(optimizer, "_exclude_from_weight_decay", None)


def activity_losses(model: keras.Model) -> list[tf.Tensor]:
    """The loss tensors the layers of ``model`` added in its last call (activity regularizers,
    ``add_loss`` in ``call``), without the weight regularizers' (made afresh on each read).

    Keras keeps them in each layer's private ``_losses`` (what ``model.losses`` lists first).

    Raises:
        RuntimeError: If a layer with an activity regularizer has no ``_losses`` any more: its
            loss's gradient would be lost without a word.
    """
    found: list[tf.Tensor] = []
    for layer in [model, *model._flatten_layers(include_self=False)]:
        own = getattr(layer, "_losses", None)
        if own is None:
            if getattr(layer, "activity_regularizer", None) is not None:
                raise RuntimeError(
                    f"tfdist cannot read the activity loss of {layer.name} (keras "
                    f"{keras.__version__}): Layer._losses is gone. Update "
                    "tfdist/_compat/keras_internals/keras_training.py."
                )
            continue
        found.extend(layer._get_own_losses())  # this thread's (shim ``thread_losses``)
    return found
