"""Parameters sharded (ZeRO-3) on recurrent and shared layers, mirrored x2, with Adam.

A model trains 3 updates of `ParameterStep` and of the unsharded Trainer on the same strategy,
data and initial weights (tests/training/zero/test_parameters.py's harness); the final weights
must agree to 1e-6. It holds the layer kinds issue 42 lists beside those test_parameters.py
covers, in one model (each model costs two traces of every unit: the CPU budget):

* recurrent: a ``Bidirectional(SimpleRNN)`` (``return_sequences=True``, unrolled) and an
  ``LSTM`` (its last output), whose step reads its gathered weights inside a ``tf.while_loop``
  and whose backward recomputes that loop;
* shared: a ``ReversibleEmbedding`` tied as the output projection (embedded, then called with
  ``reverse=True``, as KerasHub's language models) and a ``Dense`` applied twice (on 3-D, then on
  2-D input): each gathered at each use, its block's gradient the sum of its uses' (a sparse
  one and a dense one for the embedding).

Nested models on two real MultiWorkerMirrored workers: tests/strategies/test_multi_worker.py
(``trainer_zero3_accum``); KerasHub's GPT-2 (a tied embedding in a nested backbone):
tests/training/zero/test_sharding_transformers.py.
"""

import keras
import numpy as np

from tests.training.zero.test_parameters import STEPS, G, _sharded, _unsharded

VOCAB, LENGTH = 5, 3


def _recurrent_and_shared():
    ids = keras.Input((LENGTH,), dtype="int32")
    tied = keras.layers.ReversibleEmbedding(VOCAB, 4)
    dense = keras.layers.Dense(4, activation="tanh")
    h = dense(tied(ids))
    # Unrolled: a Python loop over the steps (the LSTM keeps Keras's while loop); its two
    # while loops cost about 5 CPU-s more (measured on the busy 2-core test machine).
    rnn = keras.layers.SimpleRNN(2, return_sequences=True, unroll=True)
    h = keras.layers.LSTM(4)(keras.layers.Bidirectional(rnn)(h))
    return keras.Model(ids, tied(dense(h), reverse=True))


def test_recurrent_and_shared_layers_train_as_unsharded():
    build = _recurrent_and_shared
    weights = build().get_weights()
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCAB, size=(G * STEPS, LENGTH)).astype("int32")
    y = rng.integers(0, VOCAB, size=(G * STEPS,)).astype("int32")
    adam = lambda: keras.optimizers.Adam(0.01)  # noqa: E731
    state, model = _sharded(build, weights, adam, x, y, 2)
    reference = _unsharded(build, weights, adam(), x, y, 2)
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(reference.get_weights(), weights))
    assert moved > 1e-3  # the runs train
    # Weights, not variables: the RNN cells' seed generators (unused without dropout) are
    # seeded anew by each build.
    mine = state.whole_weights() + [v.numpy() for v in model.non_trainable_weights]
    theirs = reference.trainable_variables + reference.non_trainable_weights
    gaps = {b.path: float(np.max(np.abs(a - b.numpy()))) for a, b in zip(mine, theirs, strict=True)}
    # Measured: at most 3.7e-9 (the embedding), most weights bitwise.
    assert max(gaps.values()) <= 1e-6, {k: g for k, g in gaps.items() if g > 1e-6}
