"""Test session setup: quiet TF and split the CPU into virtual devices.

Virtual devices must exist before TensorFlow initialises its devices, so this
runs at import time, before any test imports tfdist's strategies.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.pop("TF_CONFIG", None)

import tensorflow as tf  # noqa: E402

NUM_VIRTUAL_DEVICES = 4
_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_VIRTUAL_DEVICES
)
