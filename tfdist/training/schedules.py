"""Learning-rate scaling and warmup for large global batches (Goyal et al., 2017).

``lr_scaling="linear"`` multiplies the base learning rate by
``effective_global_batch / base_global_batch_size`` where the effective batch
is ``global_batch_size * accumulation_steps``. Warmup ramps linearly over
``warmup_steps`` optimizer updates: from the base (unscaled) learning rate to
the scaled one when scaling is on, as in the paper, and from 0 otherwise.
Steps are optimizer updates (``optimizer.iterations``), never micro-batches.
"""
from __future__ import annotations

from typing import Any, Literal

import keras
import tensorflow as tf

from tfdist.config import check_choice, check_positive_int, invalid_argument

LRScaling = Literal["none", "linear"]
LR_SCALINGS = ("none", "linear")


def check_warmup(warmup_steps: int | None, warmup_epochs: float | None) -> None:
    """Validates the warmup options: at most one of them, non-negative."""
    if warmup_steps is not None and warmup_epochs is not None:
        raise invalid_argument("warmup_epochs", warmup_epochs, "None when warmup_steps is given",
                               note=f"Received warmup_steps={warmup_steps} as well; pass one of them.")
    if warmup_steps is not None and (isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int)
                                     or warmup_steps < 0):
        raise invalid_argument("warmup_steps", warmup_steps, "a non-negative integer (optimizer updates)")
    if warmup_epochs is not None and not (isinstance(warmup_epochs, (int, float)) and warmup_epochs >= 0):
        raise invalid_argument("warmup_epochs", warmup_epochs, "a non-negative number of epochs")


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

    def __init__(self, base: Any, multiplier: float = 1.0, warmup_steps: int = 0,
                 warmup_from_base: bool = True) -> None:
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
        return {"base": base, "multiplier": self.multiplier, "warmup_steps": self.warmup_steps,
                "warmup_from_base": self.warmup_from_base}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "ScaledWarmup":
        base = config["base"]
        if isinstance(base, dict):
            base = keras.saving.deserialize_keras_object(base)
        return cls(base, config["multiplier"], config["warmup_steps"], config["warmup_from_base"])


class LRPlan:
    """What the Trainer asked for; resolved into numbers once the batch size is known.

    Args:
        lr_scaling: ``"none"`` or ``"linear"``.
        base_global_batch_size: The batch the base learning rate was tuned for.
        warmup_steps: Warmup length in optimizer updates.
        warmup_epochs: Warmup length in epochs (converted with the updates per epoch).
    """

    def __init__(self, lr_scaling: str = "none", base_global_batch_size: int = 256,
                 warmup_steps: int | None = None, warmup_epochs: float | None = None) -> None:
        check_choice("lr_scaling", lr_scaling, LR_SCALINGS)
        check_positive_int("base_global_batch_size", base_global_batch_size)
        check_warmup(warmup_steps, warmup_epochs)
        self.lr_scaling = lr_scaling
        self.base_global_batch_size = base_global_batch_size
        self.warmup_steps = warmup_steps
        self.warmup_epochs = warmup_epochs

    @property
    def active(self) -> bool:
        return self.lr_scaling != "none" or bool(self.warmup_steps) or bool(self.warmup_epochs)

    def schedule_for(self, learning_rate: Any) -> ScaledWarmup:
        """Wraps an optimizer config's ``learning_rate`` (a float or a serialized schedule)."""
        if isinstance(learning_rate, dict):
            learning_rate = keras.saving.deserialize_keras_object(learning_rate)
        return ScaledWarmup(learning_rate, warmup_from_base=self.lr_scaling == "linear")

    def resolve(self, schedule: ScaledWarmup, *, effective_global_batch_size: int, updates_per_epoch: int) -> None:
        """Fills in the multiplier and warmup length; call before the step is traced."""
        if self.lr_scaling == "linear":
            schedule.multiplier = effective_global_batch_size / self.base_global_batch_size
        if self.warmup_epochs is not None:
            schedule.warmup_steps = int(round(self.warmup_epochs * updates_per_epoch))
        elif self.warmup_steps is not None:
            schedule.warmup_steps = self.warmup_steps
