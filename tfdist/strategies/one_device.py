"""``one_device``: ``tf.distribute.OneDeviceStrategy`` on the first GPU, else the CPU."""

from __future__ import annotations

import tensorflow as tf

from tfdist.config import invalid_argument
from tfdist.strategies.sync import SyncRunner

#: Runs training steps on this kind's strategies (see ``tfdist/strategies/registry.py``).
RUNNER = SyncRunner


def matches(strategy: tf.distribute.Strategy) -> bool:
    """Whether ``strategy`` (built by ``make_strategy`` or by hand) is a ``OneDeviceStrategy``."""
    return isinstance(strategy, tf.distribute.OneDeviceStrategy)


def build(device: str | None = None) -> tf.distribute.Strategy:
    """Builds a OneDeviceStrategy.

    Args:
        device: A device name such as ``/gpu:0``; default the first GPU, else ``/cpu:0``.

    Raises:
        ValueError: If ``device`` is not one of this machine's logical devices
            (TF would only fail at the first op placed on it).
    """
    if device is None:
        device = "/gpu:0" if tf.config.list_logical_devices("GPU") else "/cpu:0"
    names = [d.name for d in tf.config.list_logical_devices()]
    try:
        spec = tf.DeviceSpec.from_string(device)
    except (ValueError, TypeError, AttributeError):
        spec = None
    wanted = spec and spec.device_type and f"{spec.device_type.upper()}:{spec.device_index or 0}"
    if not wanted or not any(name.upper().endswith("/DEVICE:" + wanted) for name in names):
        raise invalid_argument(
            "device",
            device,
            "a device of this machine, e.g. /cpu:0",
            note=f"Its logical devices: {', '.join(names)}.",
        )
    return tf.distribute.OneDeviceStrategy(device)
