"""``mirrored``: ``tf.distribute.MirroredStrategy`` over local GPUs or virtual CPUs."""

from __future__ import annotations

import logging

import tensorflow as tf

from tfdist.config import check_positive_int, invalid_argument
from tfdist.strategies.sync import SyncRunner

logger = logging.getLogger(__name__)


def ensure_cpu_devices(num_devices: int, argument: str = "num_devices") -> None:
    """Splits the CPU into ``num_devices`` virtual devices if it has fewer.

    Must run before TensorFlow initialises its devices. ``argument``: the name errors give.

    Raises:
        ValueError: If TF is already initialised with fewer CPU devices.
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    have = len(current) if current else 1
    if num_devices <= have:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices
        )
    except RuntimeError as e:
        raise invalid_argument(
            argument,
            num_devices,
            f"at most {have}, the CPU devices TensorFlow already initialised",
            note="Virtual CPU devices can only be created before TensorFlow initialises: "
            "call tfdist.make_strategy first in the program.",
        ) from e
    logger.info("Split the CPU into %d virtual devices", num_devices)


#: Runs training steps on this kind's strategies (see ``tfdist/strategies/registry.py``).
RUNNER = SyncRunner


def matches(strategy: tf.distribute.Strategy) -> bool:
    """Whether ``strategy`` (built by ``make_strategy`` or by hand) is a ``MirroredStrategy``."""
    return isinstance(strategy, tf.distribute.MirroredStrategy)


def build(num_devices: int | None = None) -> tf.distribute.Strategy:
    """Builds a MirroredStrategy over ``num_devices`` local devices.

    Uses GPUs when there are any (NCCL all-reduce), else CPU devices (reduced on
    one device), creating
    virtual CPU devices when the machine has fewer than ``num_devices``.

    Args:
        num_devices: Replicas; default all GPUs, or all logical CPU devices.
    """
    check_positive_int("num_devices", num_devices, allow_none=True)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        n = num_devices or len(gpus)
        if n > len(gpus):
            raise invalid_argument(
                "num_devices", n, f"at most {len(gpus)}, the GPUs on this machine"
            )
        return tf.distribute.MirroredStrategy([f"/gpu:{i}" for i in range(n)])
    if num_devices is not None:
        ensure_cpu_devices(num_devices)
    n = num_devices or len(tf.config.list_logical_devices("CPU"))
    # Virtual CPU devices share memory: reduce on one device. (The collective
    # default also reuses group keys across strategies of different sizes in
    # one process, which aborts the second one.)
    return tf.distribute.MirroredStrategy(
        [f"/cpu:{i}" for i in range(n)], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
