"""``LazyLogs``: computed once, on the first read of a value, and then a plain dict of floats."""

import copy
import json
import pickle

import keras
import numpy as np
import pytest

from tfdist.logs import LazyLogs

VALUES = {"accuracy": 0.25, "loss": 0.5}


def _lazy(counter):
    def compute():
        counter.append(1)
        return dict(VALUES)

    return LazyLogs(sorted(VALUES), compute)


def test_the_keys_are_known_without_computing():
    computed = []
    logs = _lazy(computed)
    assert isinstance(logs, dict)
    assert len(logs) == 2 and bool(logs) and "loss" in logs and "x" not in logs
    assert list(logs) == ["accuracy", "loss"] and list(logs.keys()) == ["accuracy", "loss"]
    assert (logs or {}) is logs  # Keras's ProgbarLogger at verbose=2 goes no further
    assert computed == [] and not logs.computed


def _seen_through_keras(logs):
    """What a callback sees of ``logs`` through Keras's own ``CallbackList`` (which converts)."""
    seen = []

    class Recorder(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(logs)

    keras.callbacks.CallbackList([Recorder()]).on_train_batch_end(0, logs)
    return seen[0]


READS = {
    "getitem": lambda logs: {"loss": logs["loss"], "accuracy": logs["accuracy"]},
    "get": lambda logs: {name: logs.get(name) for name in VALUES},
    "items": lambda logs: dict(logs.items()),
    "values": lambda logs: dict(zip(VALUES, logs.values())),
    "dict": dict,
    "unpacking": lambda logs: {**logs},
    "kwargs": lambda logs: (lambda **kwargs: kwargs)(**logs),
    "format": lambda logs: {"loss": float("{loss}".format(**logs)), "accuracy": 0.25},
    "json": lambda logs: json.loads(json.dumps(logs)),
    "copy": lambda logs: logs.copy(),
    "copy.copy": copy.copy,
    "deepcopy": copy.deepcopy,
    "pickle": lambda logs: pickle.loads(pickle.dumps(logs)),
    "keras_callback_list": lambda logs: _seen_through_keras(logs),
    "numpy": lambda logs: dict(zip(logs, np.array(list(logs.values())).tolist())),
}


@pytest.mark.parametrize("read", READS.values(), ids=READS.keys())
def test_every_way_to_read_sees_the_values_computed_once(read):
    computed = []
    logs = _lazy(computed)
    assert read(logs) == VALUES
    assert logs == VALUES and VALUES == logs and not (logs != VALUES)
    assert repr(logs) == repr(VALUES) and str(logs) == str(VALUES)
    assert computed == [1] and logs.computed


def test_changes_apply_to_the_computed_values():
    logs = _lazy([])
    logs["extra"] = 1.0
    assert logs == {**VALUES, "extra": 1.0}
    logs = _lazy([])
    assert logs.pop("loss") == 0.5 and logs == {"accuracy": 0.25}
    logs = _lazy([])
    logs.update(loss=1.0)
    assert logs == {"accuracy": 0.25, "loss": 1.0}
    logs = _lazy([])
    assert logs.setdefault("loss", 9.0) == 0.5


def test_a_copy_is_a_plain_dict():
    assert type(copy.copy(_lazy([]))) is dict
    assert type(_lazy([]).copy()) is dict
