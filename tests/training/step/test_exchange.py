"""The gradient exchange (bucketed, 16-bit; tfdist/training/step/exchange.py), per-call costs of
fit."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.jobs.common import builder, data, initial_weights
from tfdist.training.step.exchange import all_reduce_sum, buckets

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _fit(k=1, n=96, global_batch=16, num_devices=2, epochs=2, **options):
    trainer = tfdist.Trainer(
        builder(initial_weights()),
        strategy=tfdist.make_strategy("mirrored", num_devices=num_devices),
        optimizer=keras.optimizers.SGD(0.1),
        loss=LOSS,
        accumulation_steps=k,
        **options,
    )
    ds = tf.data.Dataset.from_tensor_slices(data(n)).batch(global_batch)
    history = trainer.fit(ds, epochs=epochs, verbose=0)
    return trainer, history


class _Call:
    """One ``ReplicaContext.all_reduce`` traced: which replica, and the tensors it reduces."""

    def __init__(self, replica, value):
        self.replica = replica
        self.shapes = [tuple(t.shape) for t in tf.nest.flatten(value)]
        self.dtypes = {t.dtype for t in tf.nest.flatten(value)}
        self.size = sum(int(np.prod(shape)) for shape in self.shapes)


class _Calls(list):
    """The all-reduces traced through TF's public ``ReplicaContext.all_reduce``."""

    def of_replica(self, replica=0):
        return [call for call in self if call.replica == replica]

    def split(self, model):
        """Replica 0's calls: (the gradient exchange's, the logs' metric reductions).

        Told apart by what they carry, not by who calls them: the logs reduce
        the model's metric state (one float32 vector of its elements), and the
        exchange carries every gradient element and the example count.
        """
        metric_size = sum(int(np.prod(v.shape)) for v in model.metrics_variables)
        calls = self.of_replica(0)
        metrics = [c for c in calls if len(c.shapes) == 1 and c.size == metric_size]
        exchange = [c for c in calls if c not in metrics]
        return exchange, metrics


@pytest.fixture
def all_reduce_calls(monkeypatch):
    """Records every all-reduce traced in replica context (replica id, shapes, dtypes)."""
    calls = _Calls()
    original = tf.distribute.ReplicaContext.all_reduce

    def recording(self, reduce_op, value, options=None):
        replica = tf.get_static_value(self.replica_id_in_sync_group)
        calls.append(_Call(int(replica), value))
        return original(self, reduce_op, value, options)

    monkeypatch.setattr(tf.distribute.ReplicaContext, "all_reduce", recording)
    return calls


def _parameter_count(model):
    return sum(int(np.prod(v.shape)) for v in model.trainable_variables)


def test_bucket_grouping_is_reverse_order_and_about_bucket_bytes():
    grads = [
        tf.zeros([6, 8]),
        tf.zeros([8]),
        tf.zeros([8, 3]),
        tf.zeros([3]),
    ]  # 192, 32, 96, 12 bytes
    assert buckets(grads, None) == [[3, 2, 1, 0]]
    assert buckets(grads, 1) == [[3], [2], [1], [0]]
    assert buckets(grads, 100) == [[3, 2], [1, 0]]  # a bucket closes once it holds >= 100 bytes
    assert buckets(grads, 10**9) == [[3, 2, 1, 0]]


@pytest.mark.parametrize("bucket_bytes,num_buckets", [(1, 4), (100, 2)])
@pytest.mark.parametrize("k", [1, 4])
def test_one_collective_per_bucket_and_same_result(all_reduce_calls, bucket_bytes, num_buckets, k):
    reference, ref_history = _fit(k=k, n=128)  # 8 micro-batches: whole updates, one train function
    all_reduce_calls.clear()
    trainer, history = _fit(k=k, n=128, bucket_bytes=bucket_bytes)
    # Traced once per replica (2): one all-reduce of ONE packed tensor per bucket, once per update
    # (accumulation included); the example count rides in the first bucket (+1 element).
    exchange, metrics = all_reduce_calls.split(trainer.model)
    assert len(all_reduce_calls.of_replica(1)) == len(exchange) + len(metrics)
    assert len(exchange) == num_buckets and len(metrics) == 1
    assert all(len(call.shapes) == 1 for call in exchange)
    assert sum(call.size for call in exchange) == _parameter_count(trainer.model) + 1
    groups = buckets([tf.zeros(v.shape) for v in trainer.model.trainable_variables], bucket_bytes)
    sizes = [
        sum(int(np.prod(trainer.model.trainable_variables[i].shape)) for i in g) for g in groups
    ]
    sizes[0] += 1  # the first bucket, which carries the count
    assert sorted(call.size for call in exchange) == sorted(sizes)
    for a, b in zip(reference.model.get_weights(), trainer.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    assert history.history["loss"] == pytest.approx(ref_history.history["loss"], abs=1e-6)


def test_no_options_is_the_original_packed_exchange(all_reduce_calls):
    default, _ = _fit()
    exchange, _ = all_reduce_calls.split(default.model)
    explicit, _ = _fit(gradient_compression=None, bucket_bytes=None)
    # One call of every gradient, as the variables are, and the example count: the strategy packs.
    expected = [tuple(v.shape) for v in default.model.trainable_variables] + [()]
    assert [call.shapes for call in exchange] == [expected]
    for a, b in zip(default.model.get_weights(), explicit.model.get_weights()):
        np.testing.assert_array_equal(a, b)  # bitwise


# Stated tolerance: 2 epochs of SGD(0.1), 12 updates, stay within 2e-3 (bf16, 8 significant bits)
# and 2e-4 (fp16, 11 bits) of the float32 exchange, absolute on weights of order 1.
@pytest.mark.parametrize("compression,tolerance", [("bf16", 2e-3), ("fp16", 2e-4)])
@pytest.mark.parametrize("bucket_bytes", [None, 100])
def test_compressed_training_stays_close_to_float32(
    all_reduce_calls, compression, tolerance, bucket_bytes
):
    reference, ref_history = _fit()
    all_reduce_calls.clear()
    trainer, history = _fit(gradient_compression=compression, bucket_bytes=bucket_bytes)
    wire = [c for c in all_reduce_calls.of_replica(0) if c.dtypes & {tf.bfloat16, tf.float16}]
    assert len(wire) == (2 if bucket_bytes else 1)  # one 16-bit collective per bucket
    assert all(len(call.shapes) == 1 for call in wire)
    moved = max(
        np.abs(a - b).max() for a, b in zip(initial_weights(), reference.model.get_weights())
    )
    assert moved > 1e-2
    diff = max(
        np.abs(a - b).max()
        for a, b in zip(reference.model.get_weights(), trainer.model.get_weights())
    )
    assert 0 < diff < tolerance
    np.testing.assert_allclose(history.history["loss"], ref_history.history["loss"], atol=tolerance)


def test_compression_with_one_replica_changes_nothing_and_says_so(caplog):
    reference, _ = _fit(num_devices=1)
    with caplog.at_level("WARNING", logger="tfdist.training.step.exchange"):
        trainer, _ = _fit(num_devices=1, gradient_compression="fp16", bucket_bytes=1024)
    for a, b in zip(reference.model.get_weights(), trainer.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    said = [r.getMessage() for r in caplog.records if "1 replica in sync" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert "gradient_compression='fp16' and bucket_bytes=1024" in said[0]


@pytest.mark.parametrize("magnitude", [1e9, 1e-9])
def test_fp16_is_scaled_so_it_neither_overflows_nor_flushes(magnitude):
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    rng = np.random.default_rng(0)
    values = [
        rng.normal(size=(2, 50)).astype("float32") * magnitude,
        rng.normal(size=(2, 3)).astype("float32"),
    ]

    @tf.function
    def exchange():
        def replica():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            grads = [tf.gather(tf.constant(v), r) for v in values]
            return all_reduce_sum(
                grads, tf.constant(8.0), num_replicas=2, bucket_bytes=1, compression="fp16"
            )

        return strategy.run(replica)

    grads, count = exchange()
    got = [strategy.experimental_local_results(g)[0].numpy() for g in grads]
    assert float(strategy.experimental_local_results(count)[0]) == 16.0
    for v, g in zip(values, got):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, v.sum(0), rtol=0, atol=2e-3 * np.abs(v).max())


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        (
            {"gradient_compression": "int8"},
            "argument `gradient_compression`. Received: gradient_compression='int8'. "
            "Expected one of: bf16, fp16, None",
        ),
        (
            {"bucket_bytes": 0},
            "argument `bucket_bytes`. Received: bucket_bytes=0. "
            "Expected a positive integer or None",
        ),
    ],
)
def test_exchange_option_errors(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        tfdist.Trainer(builder(), strategy=tfdist.make_strategy("one_device"), loss=LOSS, **kwargs)


def test_logs_are_one_packed_reduction_and_exact(all_reduce_calls):
    x, y = data(96)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    trainer = tfdist.Trainer(
        builder(initial_weights()),
        strategy=tfdist.make_strategy("mirrored", num_devices=2),
        optimizer=keras.optimizers.SGD(0.1),
        loss=LOSS,
        metrics=["accuracy"],
    )
    history = trainer.fit(ds, epochs=2, verbose=0)
    # loss tracker (total, count) + accuracy (total, count): one all-reduce of 4 values per replica.
    exchange, metrics = all_reduce_calls.split(trainer.model)
    assert [call.shapes for call in metrics] == [[(4,)]]
    assert sum(call.size for call in exchange) == _parameter_count(trainer.model) + 1  # no other
    model = builder(initial_weights())()
    model.compile(keras.optimizers.SGD(0.1), LOSS, metrics=["accuracy"])
    keras_history = model.fit(ds, epochs=2, verbose=0)
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(
            history.history[key], keras_history.history[key], atol=1e-6, rtol=0
        )


class _EveryBatch(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append((batch, dict(logs)))


def test_auto_steps_per_execution_keeps_batch_hooks_exact():
    ds = tf.data.Dataset.from_tensor_slices(data(96)).batch(16)

    def trainer(**options):
        return tfdist.Trainer(
            builder(initial_weights()),
            strategy=tfdist.make_strategy("mirrored", num_devices=2),
            optimizer=keras.optimizers.SGD(0.1),
            loss=LOSS,
            **options,
        )

    fast = trainer()
    fast_history = fast.fit(ds, epochs=2, verbose=0)
    assert fast.steps_per_execution == 32  # nothing needs every batch: one call per epoch here
    hooked, every = trainer(), _EveryBatch()
    hooked_history = hooked.fit(ds, epochs=2, verbose=0, callbacks=[every])
    assert hooked.steps_per_execution == 1
    assert [b for b, _ in every.seen] == list(range(6)) * 2  # every batch, with its running logs
    lambda_batches = []  # LambdaCallback sets its hooks on the instance, not the class
    lam = trainer()
    lam.fit(
        ds,
        epochs=1,
        verbose=0,
        callbacks=[
            keras.callbacks.LambdaCallback(
                on_train_batch_end=lambda b, logs: lambda_batches.append(b)
            )
        ],
    )
    assert lam.steps_per_execution == 1 and lambda_batches == list(range(6))
    one = trainer(steps_per_execution=1)
    one_history = one.fit(ds, epochs=1, verbose=0)
    assert every.seen[5][1]["loss"] == pytest.approx(one_history.history["loss"][0], abs=1e-7)
    assert fast_history.history == hooked_history.history
    for a, b in zip(fast.model.get_weights(), hooked.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(
        ValueError,
        match="argument `steps_per_execution`. Received: steps_per_execution='fast'. "
        "Expected a positive integer or 'auto'",
    ):
        trainer(steps_per_execution="fast")


def test_fp16_exchange_keeps_loss_scaling_overflow_skips():
    # An overflowing loss scale gives non-finite gradients: the fp16 exchange passes them on
    # (scale 1), so the loss-scale optimizer still skips the update and lowers the scale; a sane
    # scale then trains.
    optimizer = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=2.0**60
    )
    trainer = tfdist.Trainer(
        builder(initial_weights()),
        strategy=tfdist.make_strategy("mirrored", num_devices=2),
        optimizer=optimizer,
        loss=LOSS,
        precision="mixed_float16",
        accumulation_steps=2,
        gradient_compression="fp16",
        bucket_bytes=100,
    )
    ds = tf.data.Dataset.from_tensor_slices(data(96)).batch(8)
    before = trainer.model.get_weights()
    history = trainer.fit(ds, epochs=1, steps_per_epoch=2, verbose=0)
    assert history.history["skipped_updates"] == [1]
    for a, b in zip(before, trainer.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    trainer.model.optimizer.dynamic_scale.assign(2.0**10)
    history = trainer.fit(ds, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all() and history.history["skipped_updates"] == [1]


@pytest.mark.parametrize("num_replicas", [2, 3, 8, 100, 256])
def test_bf16_count_digits_sum_exactly_over_any_replica_count(num_replicas):
    # Each replica's count as bf16 digits, summed in bf16 one replica at a time (every
    # partial sum of a ring rounded to bf16), decodes to the exact total.
    from tfdist.training.step.exchange import count_digits, decode_count, encode_count

    base, digits = count_digits(num_replicas)
    rng = np.random.default_rng(num_replicas)
    counts = [2**24 - 1, 0, 1, base - 1, base, base**2 + 7]
    counts += rng.integers(0, 2**24, size=num_replicas).tolist()
    counts = counts[:num_replicas]
    summed = tf.zeros([digits], tf.bfloat16)
    for c in counts:
        summed = tf.add(summed, encode_count(tf.constant(float(c)), base, digits))
    assert float(decode_count(summed, base)) == float(np.float32(sum(counts)))
    assert count_digits(257) is None  # beyond 256 replicas: the float32 side all-reduce


def test_bf16_exchange_carries_an_odd_count_exactly_in_one_collective(all_reduce_calls):
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    values = np.arange(2 * 301, dtype="float32").reshape(2, 301) / 7

    @tf.function
    def exchange():
        def replica():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            count = tf.cast(1_000_003 + 6 * r, tf.float32)  # 1,000,003 and 1,000,009
            return all_reduce_sum(
                [tf.gather(tf.constant(values), r)], count, num_replicas=2, compression="bf16"
            )

        return strategy.run(replica)

    grads, count = exchange()
    assert float(strategy.experimental_local_results(count)[0]) == 2_000_012.0
    assert [len(all_reduce_calls.of_replica(r)) for r in (0, 1)] == [1, 1]  # no side all-reduce
    got = strategy.experimental_local_results(grads[0])[0].numpy()
    np.testing.assert_allclose(got, values.sum(0), rtol=1e-2)


def test_sparse_rows_are_gathered_in_replica_order_with_uneven_counts():
    """`gather_slices`: every replica's rows, duplicates kept, in replica order, whatever each
    replica's row count; what one device holds for the whole batch."""
    from tfdist.training.step.exchange import gather_slices

    strategy = tfdist.make_strategy("mirrored", num_devices=2)

    def replica():
        r = tf.distribute.get_replica_context().replica_id_in_sync_group
        rows = 2 + 3 * r  # 2 rows on replica 0, 5 on replica 1
        indices = tf.math.floormod(tf.range(rows) + r, 3)  # duplicates on both
        values = tf.cast(tf.reshape(tf.range(2 * rows) + 100 * r, [rows, 2]), tf.float32)
        got = gather_slices(tf.IndexedSlices(values, indices, tf.constant([3, 2])))
        return got.values, got.indices

    values, indices = strategy.run(tf.function(replica))
    want_indices = [0, 1, 1, 2, 0, 1, 2]
    want_values = np.concatenate([np.arange(4).reshape(2, 2), 100 + np.arange(10).reshape(5, 2)])
    for v, i in zip(strategy.experimental_local_results(values), indices.values):
        np.testing.assert_array_equal(v.numpy(), want_values)
        np.testing.assert_array_equal(i.numpy(), want_indices)


def test_sparse_dense_sums_rows_first_other_weights_with_adam():
    """``ExchangeOptions(sparse="dense")`` does what it says: with Adam (each row squared) the
    weights differ from Keras's, where the default "auto" (rows gathered) gives Keras's (the
    parity row itself)."""
    from tests.keras_parity.parity import run_keras, run_trainer
    from tests.keras_parity.rows_transformers import ROWS

    rows = {row.name: row for row in ROWS}
    dense = {"exchange": tfdist.ExchangeOptions(sparse="dense")}

    def difference(row):
        ref, got = run_keras(row), run_trainer(row, tfdist.make_strategy("mirrored", num_devices=2))
        return max(float(np.max(np.abs(a - b))) for a, b in zip(ref.weights, got.weights))

    # With SGD the two give the same weights: tests/bench/test_bench.py's sparse_exchange.
    adam = rows["transformers_masked_embedding_adam"]
    assert difference(dataclasses.replace(adam, trainer=dense)) > 1e-3


@pytest.mark.parametrize("name", ["transformers_lm_adam"])
def test_embedding_rows_reach_adam_as_keras_hands_them_on_one_device(name):
    """One device has nothing to exchange, yet its step once densified the embedding's
    gradient: Adam then squared summed duplicate rows, and the weights left Keras's."""
    from tests.keras_parity.parity import assert_same, run_keras, run_trainer
    from tests.keras_parity.rows_transformers import ROWS

    row = next(r for r in ROWS if r.name == name)
    assert_same(row, run_keras(row), run_trainer(row, tfdist.make_strategy("one_device")))


@pytest.mark.parametrize("options", [{"bucket_bytes": 100}, {"gradient_compression": "bf16"}])
def test_buckets_and_compression_take_dense_over_3d_input(options):
    """A ``Dense`` kernel's gradient on 3-D input is ``(None, units)`` as traced; buckets and
    16-bit packing size it from its variable, and the weights are the plain exchange's."""
    x = np.random.default_rng(0).standard_normal((32, 6, 8)).astype("float32")
    y = np.random.default_rng(1).integers(0, 2, 32).astype("int32")

    def model():
        keras.utils.set_random_seed(2)
        layers = [keras.layers.Dense(16), keras.layers.GlobalAveragePooling1D()]
        return keras.Sequential([keras.Input((6, 8)), *layers, keras.layers.Dense(2)])

    weights = []
    for extra in ({}, options):
        trainer = tfdist.Trainer(
            model,
            strategy=tfdist.make_strategy("mirrored", num_devices=2),
            optimizer=keras.optimizers.SGD(0.1),
            loss=LOSS,
            **extra,
        )
        trainer.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        weights.append(trainer.model.get_weights())
    tolerance = 1e-6 if "bucket_bytes" in options else 1e-2
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, atol=tolerance, rtol=0)
