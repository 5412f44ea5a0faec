"""The parity modules' shared mirrored strategy, and their one Keras reference per row."""

import fcntl
import os

import pytest

import tfdist
from tests.keras_parity.parity import load_result, run_keras, save_result

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


@pytest.fixture(scope="session")
def keras_reference(tmp_path_factory, request):
    """``row -> run_keras(row)``, computed once per test run and then read back.

    The mirrored, multi_worker and parameter_server modules compare the same rows with the same
    reference: plain Keras on one device, from weights that are the same in every process
    (:func:`~tests.keras_parity.parity.fixed_weights`). Each row's is computed by the first
    pytest process that needs it and kept (weights and history, all the comparison reads) in
    the run's temporary directory, which xdist's workers share; the others wait for it and
    read it. The three modules ran 65 references (56 CPU-s on the 2-core Xeon on 2026-12-03,
    timed one by one); now 28 (24 CPU-s).
    """
    root = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):  # xdist: gw0, gw1, ... live in one run directory
        root = root.parent
    directory = root / "keras-reference"
    directory.mkdir(exist_ok=True)

    def reference(row):
        prefix = str(directory / row.name)
        with open(prefix + ".lock", "w") as lock:  # closing it lets go of the lock
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.exists(prefix + ".json"):
                save_result(run_keras(row), prefix)
            return load_result(prefix)

    return reference
