"""``one_device``: ``tf.distribute.OneDeviceStrategy`` on the first GPU, else the CPU."""
from __future__ import annotations

import tensorflow as tf

from tfdist.strategies.factory import register
from tfdist.strategies.sync import SyncRunner


@register("one_device", runner=SyncRunner,
          matches=lambda s: isinstance(s, tf.distribute.OneDeviceStrategy))
def build(device: str | None = None) -> tf.distribute.Strategy:
    """Builds a OneDeviceStrategy.

    Args:
        device: A device name such as ``/gpu:0``; default the first GPU, else ``/cpu:0``.
    """
    if device is None:
        device = "/gpu:0" if tf.config.list_logical_devices("GPU") else "/cpu:0"
    return tf.distribute.OneDeviceStrategy(device)
