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

# Tests that start a local Ray cluster run in one pytest-xdist worker, one after another. Ray's
# start-up gives its raylet 30 s (hard-coded) to register, and two clusters starting at once on
# 2 busy cores can miss that. Under ``--dist loadscope`` a scope is one module; this puts the Ray
# notebook into tests/ray's scope, where it runs after that module (whose cluster is shut down
# by then: module fixtures end before the next module's tests).
RAY_SCOPE = "tests/ray/test_ray.py"
RAY_NOTEBOOK = "tests/test_notebooks.py::test_notebook_runs[06_ray.ipynb]"


def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneRayAtATime(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return RAY_SCOPE if nodeid == RAY_NOTEBOOK else super()._split_scope(nodeid)

    return OneRayAtATime(config, log)
