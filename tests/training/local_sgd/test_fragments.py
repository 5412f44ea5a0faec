"""Streaming DiLoCo: ``LocalSGDOptions(sync_every=H, fragments=K)``, fragments synced in turn.

In one process: two ``mirrored`` replicas, or one device. ``fragments=1`` is plain local SGD /
DiLoCo, covered bit for bit by ``test_local_sgd.py`` (its default path unchanged).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.jobs.common import builder
from tests.training.local_sgd.common import LOSS, W0, dataset, with_batch_norm
from tfdist.training.local_sgd import fragments


def _copies(trainer, variable):
    value = getattr(variable, "value", variable)
    return [c.numpy() for c in trainer.strategy.experimental_local_results(value)]


class _Each(keras.callbacks.Callback):
    """Each replica's copy of each trainable weight after every update."""

    def __init__(self, trainer):
        super().__init__()
        self.trainer, self.seen = trainer, {}

    def on_train_batch_end(self, batch, logs=None):
        t = int(self.model.optimizer.iterations.numpy())
        self.seen[t] = [_copies(self.trainer, v) for v in self.trainer.model.trainable_variables]


def test_the_split_is_contiguous_balanced_by_bytes_with_statistics_beside_their_layer():
    """Dense(6->8), BatchNorm(8), Dense(8->3): bytes per trainable variable 192, 32, 32 (gamma),
    96 (beta + the moving mean and variance), 96, 12. Two fragments: the cut whose largest is
    smallest, [192, 32] | [32, 96, 96, 12] (224 | 236 bytes); the statistics with BatchNorm's
    beta. Offsets with H=4: fragment 0 at t % 4 == 2, fragment 1 at multiples of 4."""
    model = with_batch_norm()
    statistics = model.non_trainable_weights
    first, second = fragments.split(model, model.trainable_variables, statistics, 2, 4)
    assert (first.parameters, first.statistics, first.bytes, first.offset) == ((0, 1), (), 224, 2)
    assert (second.parameters, second.statistics, second.bytes, second.offset) == (
        (2, 3, 4, 5),
        (0, 1),
        236,
        0,
    )
    assert fragments.cuts([100, 1, 1, 1], 3) == [0, 1, 3, 4]  # one variable at least each
    assert fragments.cuts([5, 5, 5, 5], 4) == [0, 1, 2, 3, 4]
    assert [fragments.offset(j, 4, 16) for j in range(4)] == [4, 8, 12, 0]
    assert [f.index for f in fragments.pending([first, second], 6, 4)] == [1]
    model.trainable = False  # K=1 as before: one fragment, even of no trainable variable
    (only,) = fragments.split(model, [], model.non_trainable_weights, 1, 4)
    assert (only.parameters, only.statistics, only.bytes) == ((), tuple(range(8)), 460)


def _replica_reference(syncs, updates=12):
    """Two Keras models, one per replica, each trained on its half of every batch; at update t
    each fragment in ``syncs(t)`` (a list of index lists) is averaged; then the fit's end
    averages every variable (the fragments mid-round; averaging equal copies is exact)."""
    models = []
    for _ in range(2):
        model = builder(W0)()
        model.compile(keras.optimizers.SGD(0.1), LOSS)
        models.append(model)
    batches = list(dataset()) * 2
    seen = {}
    for t in range(1, updates + 1):
        x, y = batches[t - 1]
        for replica, model in enumerate(models):
            rows = slice(8 * replica, 8 * replica + 8)
            model.train_on_batch(x[rows], y[rows])
        for indices in syncs(t):
            a, b = (m.get_weights() for m in models)
            for i in indices:
                a[i] = b[i] = (a[i] + b[i]) / np.float32(2)
            for m, w in zip(models, (a, b)):
                m.set_weights(w)
        seen[t] = [[m.get_weights()[i] for m in models] for i in range(4)]
    return seen


def test_fragments_sync_in_turn_as_the_staggered_schedule_by_hand(mirrored):
    """Plain averaging, SGD, H=4, K=2 on two replicas (12 updates): the Dense layers' weights
    are 4 variables, [kernel_0 (192 B)] | [bias_0, kernel_1, bias_1] (32 + 96 + 12 B).
    Fragment 0 syncs at t % 4 == 2, fragment 1 at t % 4 == 0: after each sync the synced
    fragment's copies are the same bits on both replicas and the other's differ; every copy is
    within 1e-6 of two Keras models trained by hand on the same schedule."""
    options = tfdist.LocalSGDOptions(4, fragments=2)
    trainer = tfdist.Trainer(
        builder(W0), strategy=mirrored, optimizer=keras.optimizers.SGD(0.1), loss=LOSS,
        local_sgd=options, steps_per_execution=1,
    )  # fmt: skip
    spy = _Each(trainer)
    history = trainer.fit(dataset(), epochs=2, verbose=0, callbacks=[spy]).history
    assert history["syncs"] == [3.0, 6.0]
    split = [f.parameters for f in trainer._functions.updates.local.fragments]
    assert split == [(0,), (1, 2, 3)]
    reference = _replica_reference(lambda t: [split[j] for j in range(2) if t % 4 == (2, 0)[j]])
    for t, copies in spy.seen.items():
        for i, (first, second) in enumerate(copies):
            for replica, copy in enumerate((first, second)):
                np.testing.assert_allclose(copy, reference[t][i][replica], atol=1e-6, rtol=0)
            if t % 2:
                continue
            synced = split[0] if t % 4 == 2 else split[1]
            assert np.array_equal(first, second) == (i in synced), (t, i)
    final = trainer.model.trainable_variables  # the fit's end synced fragment 0 (at update 10)
    for v, (a, b) in zip(final, spy.seen[12]):
        for copy in _copies(trainer, v):
            np.testing.assert_array_equal(copy, (a + b) / np.float32(2), err_msg=v.path)


def test_with_one_replica_fragments_change_nothing():
    """One device: averaging is the identity, so any split trains as plain training, bitwise."""
    one = tfdist.make_strategy("one_device")

    def fit(local_sgd):
        trainer = tfdist.Trainer(
            builder(W0), strategy=one, optimizer=keras.optimizers.Adam(0.05), loss=LOSS,
            local_sgd=local_sgd,
        )  # fmt: skip
        trainer.fit(dataset(), epochs=2, verbose=0)
        return trainer.model.get_weights()

    for a, b in zip(fit(None), fit(tfdist.LocalSGDOptions(6, fragments=3))):
        np.testing.assert_array_equal(a, b)


def test_diloco_steps_each_fragment_with_its_own_outer_optimizer():
    """One device, H=4, K=2, inner SGD(0.1), outer Adam(0.1): at fragment j's sync its
    parameters go back to their anchors and its own outer Adam steps them by the change since
    (the other fragment untouched, its round going on); by hand with two Keras Adams, to 1e-6.
    A shared Adam would count 2 steps a round and bias-correct each fragment's first step as
    its second. Each outer optimizer steps once per sync of its fragment, the fit's end
    included."""
    options = tfdist.LocalSGDOptions(4, outer_optimizer=keras.optimizers.Adam(0.1), fragments=2)
    trainer = tfdist.Trainer(
        builder(W0), strategy=tfdist.make_strategy("one_device"),
        optimizer=keras.optimizers.SGD(0.1), loss=LOSS, local_sgd=options,
    )  # fmt: skip
    trainer.fit(dataset(), epochs=2, verbose=0)  # 12 updates: 0 at 2, 6, 10; 1 at 4, 8, 12
    state = trainer._functions.updates.local
    split = [f.parameters for f in state.fragments]
    assert split == [(0,), (1, 2, 3)]
    # Fragment 0: 3 syncs and the fit's end (10 to 12); fragment 1 synced at 12, no more.
    assert [int(o.iterations.numpy()) for o in state.outers] == [4, 3]

    model = builder(W0)()
    model.compile(keras.optimizers.SGD(0.1), LOSS)
    outers = [keras.optimizers.Adam(0.1) for _ in split]
    for outer, indices in zip(outers, split):
        outer.build([model.trainable_variables[i] for i in indices])
    anchors = [np.array(w) for w in W0]

    def outer_step(j):
        variables = [model.trainable_variables[i] for i in split[j]]
        change = [anchors[i] - variables[k].numpy() for k, i in enumerate(split[j])]
        for k, i in enumerate(split[j]):
            variables[k].assign(anchors[i])
        outers[j].apply([tf.constant(c) for c in change], variables)
        for k, i in enumerate(split[j]):
            anchors[i] = variables[k].numpy()

    for t, (x, y) in enumerate(list(dataset()) * 2, start=1):
        model.train_on_batch(x, y)
        outer_step(0 if t % 4 == 2 else 1) if t % 2 == 0 else None
    outer_step(0)  # the fit's end: fragment 0's partial round (updates 11 and 12)
    for a, b in zip(model.get_weights(), trainer.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


def test_a_transformer_streams_diloco_on_two_replicas(mirrored):
    """The causal transformer LM (an Embedding, MultiHeadAttention, LayerNormalization, Dense
    over 3-D input) on mirrored x2 with Adam inside, Nesterov outside, H=6, K=3: after each
    fragment's sync its copies are the same bits on both replicas, the others' not; each outer
    optimizer steps once per sync of its fragment; the fit ends with every copy the same."""
    from tests.keras_parity.rows_transformers import lm_model, text

    outer = keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)
    trainer = tfdist.Trainer(
        lm_model, strategy=mirrored, optimizer=keras.optimizers.Adam(0.01), loss=LOSS,
        local_sgd=tfdist.LocalSGDOptions(6, outer_optimizer=outer, fragments=3),
        steps_per_execution=1,
    )  # fmt: skip
    spy = _Each(trainer)
    ids = text(96)
    history = trainer.fit(
        ids[:, :-1], ids[:, 1:], batch_size=16, epochs=2, verbose=0, callbacks=[spy]
    ).history  # 12 updates: fragment 0 syncs at 2, 8; 1 at 4, 10; 2 at 6, 12
    assert history["syncs"] == [3.0, 6.0]
    state = trainer._functions.updates.local
    assert len(state.fragments) == 3 and all(f.parameters for f in state.fragments)
    # Fragments 0 and 1 again at the fit's end (their partial rounds); fragment 2 synced at 12.
    assert [int(o.iterations.numpy()) for o in state.outers] == [3, 3, 2]
    for t in (2, 4, 6, 8, 10, 12):
        synced = state.fragments[(t % 6) // 2 - 1].parameters
        for i, (first, second) in enumerate(spy.seen[t]):
            assert np.array_equal(first, second) == (i in synced), (t, i)
    for v in trainer.model.trainable_variables:
        first, second = _copies(trainer, v)
        np.testing.assert_array_equal(first, second, err_msg=v.path)


class _Crash(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == 7:
            raise RuntimeError("simulated crash")


def test_a_backup_resumes_streaming_diloco_mid_round_bitwise(mirrored, tmp_path):
    """Two replicas, BatchNorm, Adam inside, Nesterov outside, H=4, K=2, a backup every 2
    updates: a crash after update 7 resumes from update 6 (fragment 0 just synced, fragment 1
    mid-round; each replica its own rows, each fragment's outer optimizer its own state) and
    ends bitwise where an uninterrupted run ends. A resume under another ``fragments`` (1 or
    4: other outer optimizers, another schedule) is refused by name before anything is read,
    and the backup then still resumes bitwise."""

    def fit(callbacks=None, fragments_=2, **backup):
        keras.utils.set_random_seed(1)
        outer = keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)
        options = tfdist.LocalSGDOptions(4, outer_optimizer=outer, fragments=fragments_)
        trainer = tfdist.Trainer(
            with_batch_norm(), strategy=mirrored, optimizer=keras.optimizers.Adam(0.01),
            loss=LOSS, local_sgd=options, steps_per_execution=1, **backup,
        )  # fmt: skip
        history = trainer.fit(dataset(), epochs=2, verbose=0, callbacks=callbacks).history
        outers = [o.iterations.numpy() for o in trainer._functions.updates.local.outers]
        return trainer.model.get_weights(), history, outers

    reference, _, reference_outers = fit()
    backup = {"backup": tfdist.BackupOptions(str(tmp_path / "backup"), freq=2)}
    with pytest.raises(RuntimeError, match="simulated crash"):
        fit([_Crash()], **backup)
    for other in (1, 4):
        with pytest.raises(ValueError) as refused:
            fit(fragments_=other, **backup)
        message = str(refused.value)
        assert message.startswith(
            f"Invalid value for argument `fragments`. Received: fragments={other}. Expected "
            f"fragments=2, what the backup in {tmp_path / 'backup'} holds"
        ), message
    resumed, history, outers = fit(**backup)
    assert history["syncs"][-1] == 6.0 and outers == reference_outers
    for a, b in zip(reference, resumed):
        np.testing.assert_array_equal(a, b)


class _Begin(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.weights = [v.numpy() for v in self.model.trainable_variables]


def test_an_elastic_resume_syncs_the_fragments_mid_round(mirrored, tmp_path):
    """A 2-replica backup at update 6 of H=4, K=2 (plain averaging, Adam) resumes on one
    device: fragment 0, synced at update 6, keeps its one value; fragment 1, mid-round, is the
    replicas' mean (bitwise)."""
    backup = {"backup_dir": str(tmp_path / "backup"), "backup_freq": 2}
    options = tfdist.LocalSGDOptions(4, fragments=2)
    trainer = tfdist.Trainer(
        builder(W0), strategy=mirrored, optimizer=keras.optimizers.Adam(0.01), loss=LOSS,
        local_sgd=options, steps_per_execution=1, **backup,
    )  # fmt: skip
    spy = _Each(trainer)
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer.fit(dataset(), epochs=2, verbose=0, callbacks=[spy, _Crash()])
    begin = _Begin()
    resumed = tfdist.Trainer(
        builder(W0), strategy=tfdist.make_strategy("one_device"),
        optimizer=keras.optimizers.Adam(0.01), loss=LOSS, local_sgd=options,
        steps_per_execution=1, **backup,
    )  # fmt: skip
    resumed.fit(dataset(), epochs=2, verbose=0, callbacks=[begin])
    split = [f.parameters for f in resumed._functions.updates.local.fragments]
    assert split == [(0,), (1, 2, 3)]
    for i, ((a, b), value) in enumerate(zip(spy.seen[6], begin.weights)):
        if i in split[0]:
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(value, a)
        else:
            assert not np.array_equal(a, b)
            np.testing.assert_array_equal(value, (a + b) / np.float32(2))


def _four_variables(strategy, fragments_):
    return tfdist.Trainer(
        builder(W0), strategy=strategy, optimizer="sgd", loss=LOSS,
        local_sgd=tfdist.LocalSGDOptions(10, fragments=fragments_),
    )  # fmt: skip


@pytest.mark.parametrize(
    "make, received, expected",
    [
        (lambda: tfdist.LocalSGDOptions(4, fragments=0), "0", "a positive integer"),
        (lambda: tfdist.LocalSGDOptions(4, fragments=2.0), "2.0", "a positive integer"),
        (lambda: tfdist.LocalSGDOptions(4, fragments=True), "True", "a positive integer"),
        (lambda: tfdist.LocalSGDOptions(4, fragments=8), "8", "a divisor of sync_every=4"),
        (lambda: tfdist.LocalSGDOptions(4, fragments=3), "3", "a divisor of sync_every=4"),
        (
            lambda: tfdist.LocalSGDOptions(4, adapt_to_stragglers=True, fragments=2),
            "2",
            "1 with adapt_to_stragglers=True",
        ),
        (
            lambda: _four_variables(tfdist.make_strategy("one_device"), 5),
            "5",
            "at most the model's 4 trainable variables",
        ),
    ],
    ids=["zero", "float", "bool", "above_H", "not_a_divisor", "adapting", "above_variables"],
)
def test_bad_fragments_are_refused_by_name(make, received, expected):
    with pytest.raises(ValueError) as refused:
        make()
    message = str(refused.value)
    assert message.startswith(
        f"Invalid value for argument `fragments`. Received: fragments={received}"
    ), message
    assert expected in message.split(". Expected ", 1)[1], message


def test_a_keras_hub_gpt2_backbone_trains_in_fragments_as_keras_on_one_device():
    """KerasHub's GPT-2 backbone (constructor, random weights) under a Dense head, a padding
    mask, Adam: cut into 2 fragments synced in turn every update on one replica, it trains as
    plain Keras on one device (a sync of one replica changes nothing)."""
    from tests.keras_parity.parity import Row, assert_same, run_keras, run_trainer
    from tests.training.zero.test_sharding_transformers import BATCH, gpt2, padded_text

    inputs, y = padded_text()
    row = Row(
        "gpt2_backbone_fragments",
        gpt2,
        lambda: dict(optimizer=keras.optimizers.Adam(0.02), loss=LOSS),
        lambda: dict(x=inputs, y=y, batch_size=BATCH, epochs=2, shuffle=False),
        trainer=dict(local_sgd=tfdist.LocalSGDOptions(sync_every=2, fragments=2)),
        strategies=("one_device",),
        history_keys=("loss",),
    )
    assert_same(row, run_keras(row), run_trainer(row, tfdist.make_strategy("one_device")))
