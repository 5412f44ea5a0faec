"""Small variables kept whole under ``sharding="parameters"``
(``ExchangeOptions(keep_whole_below=...)``, issue 42 item 5, DeepSpeed's parameter persistence
threshold), on mirrored x2 against the unsharded Trainer: the final weights to 1e-6 (Adam with
epsilon 1e-3, so that the attention's key bias, whose exact gradient is zero, moves by noise
only), with the whole norm clipped
(a kept variable's norm counted once, not once per replica) and with accumulation (a kept
variable's gradient summed over the micro-batches whole); and the option's refusals.
"""

import keras
import pytest

from tests.training.zero.test_parameters import _data, _transformer
from tests.training.zero.test_parameters_trainer import _gap, _trainer
from tfdist import ExchangeOptions

G = 12


@pytest.mark.parametrize("k", [1, 2], ids=["clipnorm", "accumulation"])
def test_small_variables_kept_whole_train_as_unsharded(k):
    # Under 20 elements: the biases (8, 16, 3, the attention's 2x4) and LayerNormalization's
    # (8, all its variables: it runs as a plain layer); the kernels are cut.
    build = _transformer
    weights = build().get_weights()
    x, y = _data(build())

    def optimizer():
        # SGD: Adam's update would hide a norm counted twice (it is scale-free).
        return (
            keras.optimizers.SGD(0.5, global_clipnorm=0.05)
            if k == 1
            # Adam's epsilon 1e-3: the attention's key bias has a zero gradient in exact
            # arithmetic (the softmax over keys ignores q.b_k), so under Keras's 1e-7 Adam turns
            # its rounding noise into steps of the learning rate's size, which differ between
            # any two exchanges (CI once read 2.4e-5). 1e-3 keeps noise noise; the other
            # gradients are far larger, so Adam still scales them.
            else keras.optimizers.Adam(0.01, epsilon=1e-3)
        )

    # Both spellings: the Trainer's shortcut keywords, and an ExchangeOptions.
    kept = (
        ("parameters", {"keep_whole_below": 20})
        if k == 1
        else (None, {"exchange": ExchangeOptions(sharding="parameters", keep_whole_below=20)})
    )
    runs = [
        _trainer(build, weights, optimizer(), sharding, accumulation_steps=k, **options)
        for sharding, options in (kept, (None, {}))
    ]
    for trainer in runs:
        trainer.fit(x, y, batch_size=G // k, epochs=1, shuffle=False, verbose=0)
    state = runs[0]._functions.sharded
    assert state.kept and state.cut_indices  # some whole, some cut
    held = runs[0].replica_bytes
    assert held["parameters"] < held["unsharded"]["parameters"]
    mine, theirs = (t.model.get_weights() for t in runs)
    assert _gap(theirs, weights) > 1e-3  # the runs train
    paths = [v.path for v in runs[1].model.weights]
    gaps = {p: _gap([a], [b]) for p, a, b in zip(paths, mine, theirs, strict=True)}
    assert max(gaps.values()) <= 1e-6, gaps


@pytest.mark.parametrize(
    "options, expected",
    [
        ({"sharding": "parameters", "keep_whole_below": -1}, "a non-negative integer"),
        ({"sharding": "parameters", "keep_whole_below": 4.5}, "a non-negative integer"),
        ({"sharding": "gradients", "keep_whole_below": 4096}, "None with sharding='gradients'"),
        ({"keep_whole_below": 4096}, "None with sharding=None"),
    ],
)
def test_keep_whole_below_refusals(options, expected):
    with pytest.raises(ValueError, match="keep_whole_below") as raised:
        ExchangeOptions(**options)
    assert expected in str(raised.value) and str(options["keep_whole_below"]) in str(raised.value)
