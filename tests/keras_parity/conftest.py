"""The parity modules' shared mirrored strategy."""

import pytest

import tfdist

_SHARED: list = []


@pytest.fixture
def mirrored():
    """One mirrored x2 strategy for every parity test (each new one adds device state).

    It is made again when its devices no longer exist: a parameter-server module that ran
    earlier in this process (``allow_late_connect=True``) renames the local devices
    ``/job:chief/...``, and the old strategy's ``/job:localhost/...`` ones are then unknown.
    """
    import tensorflow as tf

    if _SHARED:
        names = {device.name for device in tf.config.list_logical_devices("CPU")}
        if not set(_SHARED[0].extended.worker_devices) <= names:
            _SHARED.clear()
    if not _SHARED:
        _SHARED.append(tfdist.make_strategy("mirrored", num_devices=2))
    return _SHARED[0]
