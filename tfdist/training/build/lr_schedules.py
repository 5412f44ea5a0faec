"""Learning-rate scaling and warmup for large global batches (Goyal et al., 2017).

``LRScaling("linear")`` (``Trainer(lr_scaling="linear")`` for short)
multiplies the base learning rate by ``effective_global_batch /
base_global_batch_size`` where the effective batch
is ``global_batch_size * accumulation_steps``. Warmup ramps linearly over
``warmup_steps`` optimizer updates: from the base (unscaled) learning rate to
the scaled one when scaling is on, as in the paper, and from 0 otherwise.
Steps are optimizer updates (``optimizer.iterations``), never micro-batches.
With scaling or warmup, the Trainer's logs carry ``learning_rate``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

if TYPE_CHECKING:
    from tfdist.training.options import LRScaling


@keras.saving.register_keras_serializable(package="tfdist")
class ScaledWarmup(keras.optimizers.schedules.LearningRateSchedule):
    """``base(step) * multiplier``, ramped linearly over the first ``warmup_steps`` updates.

    Args:
        base: The user's learning rate: a float or a Keras schedule.
        multiplier: Linear-scaling factor (1.0 for none).
        warmup_steps: Updates over which to ramp (0 for none).
        warmup_from_base: Ramp from the unscaled base rate (Goyal et al.)
            rather than from 0.
    """

    def __init__(
        self,
        base: Any,
        multiplier: float = 1.0,
        warmup_steps: int = 0,
        warmup_from_base: bool = True,
    ) -> None:
        self.base = base
        self.multiplier = float(multiplier)
        self.warmup_steps = int(warmup_steps)
        self.warmup_from_base = bool(warmup_from_base)

    def _base(self, step: tf.Tensor) -> tf.Tensor:
        if isinstance(self.base, keras.optimizers.schedules.LearningRateSchedule):
            return tf.cast(self.base(step), tf.float32)
        return tf.constant(float(self.base), tf.float32)

    def __call__(self, step: Any) -> tf.Tensor:
        step = tf.cast(step, tf.float32)
        base = self._base(step)
        target = base * self.multiplier
        if self.warmup_steps <= 0:
            return target
        start = base if self.warmup_from_base else tf.zeros_like(base)
        fraction = tf.minimum(step / float(self.warmup_steps), 1.0)
        return start + (target - start) * fraction

    def get_config(self) -> dict[str, Any]:
        base = self.base
        if isinstance(base, keras.optimizers.schedules.LearningRateSchedule):
            base = keras.saving.serialize_keras_object(base)
        return {
            "base": base,
            "multiplier": self.multiplier,
            "warmup_steps": self.warmup_steps,
            "warmup_from_base": self.warmup_from_base,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ScaledWarmup:
        base = config["base"]
        if isinstance(base, dict):
            base = keras.saving.deserialize_keras_object(base)
        return cls(base, config["multiplier"], config["warmup_steps"], config["warmup_from_base"])


def schedule_for(learning_rate: Any, options: LRScaling) -> ScaledWarmup:
    """Wraps an optimizer config's ``learning_rate`` (a float or a serialized schedule).

    The multiplier and warmup length stay neutral until `resolve` fills
    them in, once ``fit`` knows the batch size and the updates per epoch.
    """
    if isinstance(learning_rate, dict):
        learning_rate = keras.saving.deserialize_keras_object(learning_rate)
    return ScaledWarmup(learning_rate, warmup_from_base=options.rule == "linear")


def resolve(
    schedule: ScaledWarmup,
    options: LRScaling,
    *,
    effective_global_batch_size: int,
    updates_per_epoch: int,
) -> None:
    """Fills in the multiplier and warmup length; call before the train step is traced.

    The schedule's fields are read when ``schedule(step)`` is traced, so a
    value set after tracing would not reach the compiled step.
    """
    if options.rule == "linear":
        schedule.multiplier = effective_global_batch_size / options.base_global_batch_size
    if options.warmup_epochs is not None:
        schedule.warmup_steps = int(round(options.warmup_epochs * updates_per_epoch))
    elif options.warmup_steps is not None:
        schedule.warmup_steps = options.warmup_steps
