"""Shared in-process parameter-server strategies for the PS tests.

The test session runs other TensorFlow work first, so the strategies are made
with ``allow_late_connect=True`` (nothing made before is used afterwards).
"""

import tfdist


def ps_strategy(**options):
    return tfdist.make_strategy("parameter_server", allow_late_connect=True, **options)


def loss_tracker(model):
    """The model's loss metric (a ``Mean`` named "loss"), through the public ``model.metrics``."""
    return next(m for m in model.metrics if m.name == "loss")
