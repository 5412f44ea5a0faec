"""The compat shims: in force exactly where their probe finds the behaviour, still needed upstream.

Three kinds of test, all meaningful on any Keras version:
  * ``test_upstream_still_*`` assert what upstream does today. Each fails when
    upstream changes that behaviour: then drop (or re-probe) the shim.
  * ``test_probe_*`` check each probe against the shim's own fixed version, so
    a probe that always said "needed" (or never) would be caught.
  * the others check that the shim machinery applies exactly what the probes
    ask for, and that each shim does its job.

The multi-process proof that upstream Keras still crashes without the shims is
``tests/strategies/test_multi_worker.py::test_upstream_keras_still_needs_the_shim``.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist import _compat
from tfdist._compat.keras_internals import masks

TABLE = _compat.SHIM_TABLE + _compat.SHARDED_VARIABLE_SHIM_TABLE


def test_shims_in_force_exactly_where_their_probe_says():
    """On any Keras: a shim is in force iff enabled and probed, and then it is what runs."""
    applied = _compat.apply() + _compat.apply_sharded_variable_shims()
    off = _compat.disabled()
    assert applied == [shim.name for shim in TABLE if shim.name not in off and shim.probe()]
    for shim in TABLE:
        first = shim.patches[0]
        current = getattr(first.owner(), first.attribute)
        if shim.name in applied:
            upstream = _compat.original(shim.name)
            assert upstream is not None and current is not upstream
        else:
            assert _compat.original(shim.name) is None
    assert _compat.apply() == [name for name in applied if name in _compat.SHIMS]  # idempotent


def test_shim_table():
    assert _compat.SHIMS == (
        "symbolic_build",
        "multi_worker_reduce",
        "atomic_assign_add",
        "sharded_variables",
        "thread_losses",
    )
    assert _compat.SHARDED_VARIABLE_SHIMS == (
        "sharded_gradients",
        "sharded_weight_decay",
        "sharded_slots",
    )
    for shim in TABLE:
        assert shim.reason and "\n" not in shim.reason and shim.patches
        assert _compat.shim(shim.name) is shim
        for patch in shim.patches:  # every patch target still exists upstream
            assert callable(getattr(patch.owner(), patch.attribute))


def test_disable_env(monkeypatch):
    monkeypatch.setenv("TFDIST_DISABLE_COMPAT", " symbolic_build, sharded_slots ")
    assert _compat.disabled() == {"symbolic_build", "sharded_slots"}


# -- upstream behaviour the shims work around (fail when upstream changes) ----
def test_upstream_still_reduces_the_batch_to_build():
    assert _compat.keras_reduces_batch_to_build()


def test_upstream_still_reduces_scalars_on_axis_0():
    assert _compat.keras_reduces_scalars_on_axis_0()


def test_upstream_still_updates_sharded_variables_through_extended_update():
    assert _compat.keras_updates_sharded_through_extended_update()
    assert _compat.sharded_variable_lacks_array()


def test_upstream_still_reduces_masked_terms_by_local_count():
    # tfdist.training.step.masked_losses takes Keras's masked terms apart by this count.
    assert masks.keras_reduces_masked_terms_by_local_count()


def test_upstream_still_keeps_masks_on_tensors_and_a_slice_drops_them():
    # The train step cuts its predictions (step.update.forward_never_empty) and puts the mask back.
    ids = tf.constant([[1, 2, 0], [3, 0, 0]])
    embedded = keras.layers.Embedding(4, 2, mask_zero=True)(ids)
    mask = masks.keras_mask(embedded)
    assert mask is not None and mask.numpy().tolist() == [[True, True, False], [True, False, False]]
    assert masks.keras_mask(embedded[:1]) is None
    cut = masks.with_keras_mask(embedded[:1], mask[:1])
    assert masks.keras_mask(cut).numpy().tolist() == [[True, True, False]]


def test_masked_terms_leave_keras_losses_alone_outside_the_block():
    y_true = tf.constant([[[1.0], [2.0]]])
    y_pred = masks.with_keras_mask(tf.zeros((1, 2, 1)), tf.constant([[True, False]]))
    before = float(keras.losses.MeanSquaredError()(y_true, y_pred))
    with masks.masked_terms(lambda value, count: value * 0.0) as recording:
        assert float(keras.losses.MeanSquaredError()(y_true, y_pred)) == 0.0
    assert recording.calls == 1 and float(recording.terms[0].count) == 1.0
    assert float(keras.losses.MeanSquaredError()(y_true, y_pred)) == before == 1.0


def test_upstream_assign_add_is_still_read_then_write():
    assert _compat.keras_assign_add_is_read_then_write()


def test_upstream_layers_still_keep_add_loss_terms_in_one_shared_list():
    assert _compat.keras_layer_losses_are_shared()


def test_upstream_optimizer_still_all_reduces_through_the_hook():
    """`gradients_already_summed` swaps this private method; fails if Keras renames it."""
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    assert callable(getattr(TFOptimizer, "_all_reduce_sum_gradients", None))


def _apply_one_step(strategy, *, summed: bool) -> float:
    """Each of 2 replicas applies gradient 1.0 to w=0 with SGD(lr=1)."""
    with strategy.scope():
        w = keras.Variable(0.0)
        opt = keras.optimizers.SGD(1.0)
        opt.build([w])

    @tf.function
    def step():
        strategy.run(lambda: opt.apply([tf.constant(1.0)], [w]))

    if summed:
        with _compat.gradients_already_summed(opt):
            step()
    else:
        step()
    return float(w.numpy())


def test_the_hook_is_what_all_reduces():
    """Behaviour, not names: with the hook swapped, the optimizer no longer sums across replicas."""
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    assert _apply_one_step(strategy, summed=False) == pytest.approx(-2.0)
    assert _apply_one_step(strategy, summed=True) == pytest.approx(-1.0)


# -- probes against the fixed versions ----------------------------------------
def _upstream(name):
    patch = _compat.shim(name).patches[0]
    return _compat.original(name) or getattr(patch.owner(), patch.attribute)


@pytest.mark.parametrize(
    "name,probe",
    [
        ("symbolic_build", _compat.keras_reduces_batch_to_build),
        ("multi_worker_reduce", _compat.keras_reduces_scalars_on_axis_0),
        ("atomic_assign_add", _compat.keras_assign_add_is_read_then_write),
        ("sharded_variables", _compat.keras_updates_sharded_through_extended_update),
        ("thread_losses", _compat.keras_layer_losses_are_shared),
        ("sharded_weight_decay", _compat.keras_weight_decay_uses_extended_update),
        ("sharded_slots", _compat.keras_slots_colocate_with_reference),
    ],
)
def test_probe_sees_the_fix(name, probe):
    """A probe that always said "needed" would fail here: the shim's own replacement passes it."""
    fixed = _compat.shim(name).patches[0].make(_upstream(name))
    assert not probe(fixed)


def test_is_sharded_variable_knows_tf_class():
    """One check for ShardedVariable (the step and the shims): fails if TF renames the class."""
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    sharded = ShardedVariable([tf.Variable([1.0]), tf.Variable([2.0])])
    assert _compat.is_sharded_variable(sharded)
    assert not _compat.is_sharded_variable(tf.Variable([1.0]))
    assert [float(v.numpy()[0]) for v in _compat.shards_of(sharded)] == [1.0, 2.0]
    assert _compat.shards_of(keras.Variable([1.0])) is None


# -- the shims themselves -----------------------------------------------------
def test_plain_model_fit_under_mirrored():
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        model.compile(
            "sgd",
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = np.arange(64) % 3
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_gradients_already_summed_restores_the_optimizer():
    inner = keras.optimizers.SGD()
    opt = keras.optimizers.LossScaleOptimizer(inner)
    with _compat.gradients_already_summed(opt):
        assert inner._all_reduce_sum_gradients([(1, 2)]) == [(1, 2)]
    assert "_all_reduce_sum_gradients" not in vars(inner)
    assert inner._all_reduce_sum_gradients.__func__ is type(inner)._all_reduce_sum_gradients


def test_missing_hook_raises_with_several_replicas(monkeypatch):
    """A Keras without the hook would all-reduce twice (gradients x replicas): refuse loudly."""
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    monkeypatch.delattr(TFOptimizer, "_all_reduce_sum_gradients")
    opt = keras.optimizers.SGD()
    with pytest.raises(
        RuntimeError, match="_all_reduce_sum_gradients.*multiplied by the replica count"
    ):
        with _compat.gradients_already_summed(opt, num_replicas=2):
            pass
    with _compat.gradients_already_summed(opt, num_replicas=1):  # one replica: nothing to sum twice
        pass


def test_missing_hook_stops_the_trainer(monkeypatch):
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    trainer = tfdist.Trainer(
        lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]),
        strategy=strategy,
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    monkeypatch.delattr(TFOptimizer, "_all_reduce_sum_gradients")
    x = np.zeros((8, 4), "float32")
    with pytest.raises(RuntimeError, match="_all_reduce_sum_gradients"):
        trainer.fit((x, np.zeros(8)), epochs=1, global_batch_size=4, verbose=0)


def test_atomic_assign_add_keeps_keras_semantics():
    v = keras.Variable(1.0)
    v.assign_add(2.0)
    v.assign_sub(0.5)
    assert float(v.numpy()) == 2.5
    i = keras.Variable(0, dtype="int64")
    i.assign_add(1)
    assert int(i.numpy()) == 1


def test_add_loss_terms_are_kept_per_thread():
    """MirroredStrategy's replica threads each see their own terms (issue 42); Keras's own
    clear at a top-level call clears this thread's only."""
    import threading

    layer = keras.layers.ActivityRegularization(l2=1.0)
    layer(tf.ones([2, 3]))
    seen = {}

    def other():
        seen["before"] = len(layer.losses)
        layer(2.0 * tf.ones([1, 3]))
        seen["after"] = [float(t) for t in layer.losses]

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == {"before": 0, "after": [12.0]}  # 1.0 * 12 / 1 example
    assert [float(t) for t in layer.losses] == [3.0]  # 1.0 * 6 / 2 examples: this thread's own


def test_importing_tfdist_leaves_tensorflow_uninitialised():
    """The probes run at import; a multi-worker program creates its strategy after that."""
    import subprocess
    import sys

    code = (
        "import tfdist, tensorflow as tf; cpu = tf.config.list_physical_devices('CPU')[0]; "
        "tf.config.set_logical_device_configuration("
        "cpu, [tf.config.LogicalDeviceConfiguration()] * 2)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def _failing_async_write(tmp_path):
    """An asynchronous write that fails in TF's writer thread: its index path is a directory."""
    checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
    (tmp_path / "ckpt-1.index").mkdir()
    options = tf.train.CheckpointOptions(enable_async=True)
    checkpoint.write(str(tmp_path / "ckpt-1"), options=options)
    return checkpoint


def test_upstream_sync_still_swallows_an_async_write_error(tmp_path):
    from tfdist._compat.tf_internals.checkpoint import release_async_writer, take_async_write_error

    checkpoint = _failing_async_write(tmp_path)
    checkpoint.sync()  # waits, and raises nothing: why tfdist takes the error itself
    error = take_async_write_error(checkpoint)
    assert error is not None and "ckpt-1" in str(error)
    assert take_async_write_error(checkpoint) is None  # taken once
    release_async_writer(checkpoint)


def test_upstream_async_writer_still_lives_until_exit(tmp_path):
    import gc
    import weakref

    from tfdist._compat.tf_internals.checkpoint import release_async_writer

    def written_variable(path, release):
        variable = tf.Variable(1.0)
        checkpoint = tf.train.Checkpoint(v=variable)
        checkpoint.write(path, options=tf.train.CheckpointOptions(enable_async=True))
        checkpoint.sync()
        if release:
            release_async_writer(checkpoint)
        return weakref.ref(variable)

    kept = written_variable(str(tmp_path / "kept"), release=False)
    released = written_variable(str(tmp_path / "released"), release=True)
    gc.collect()
    assert kept() is not None  # TF's writer, held by atexit, keeps what it writes alive
    assert released() is None


def test_upstream_python_state_still_has_no_async_copy():
    from tfdist._compat.tf_internals.checkpoint import WrittenFromItself

    class Plain(tf.train.experimental.PythonState):
        def serialize(self):
            return "x"

        def deserialize(self, string_value):
            pass

    class Ours(WrittenFromItself, Plain):
        pass

    with pytest.raises(NotImplementedError):  # TF warns and skips it at every traced copy
        Plain()._copy_trackable_to_cpu(object_map={})
    object_map = {}
    Ours()._copy_trackable_to_cpu(object_map=object_map)
    assert object_map == {}  # left out of the copy: the writer serializes the object itself


def _drain(distributed):
    iterator = iter(distributed)
    return iterator, [tf.nest.map_structure(lambda t: t.numpy(), batch) for batch in iterator]


def test_upstream_still_makes_a_multi_device_iterator_for_one_cpu_replica():
    # Why tfdist.strategies.sync switches such inputs to a plain iterator (about 0.17 s each).
    strategy = tfdist.make_strategy("one_device")
    bound = tfdist.data.load("digits", split="train", seed=0).bind(global_batch_size=64)
    iterator = iter(strategy.distribute_datasets_from_function(bound))
    assert type(iterator._iterators[0]._iterator).__name__ == "OwnedMultiDeviceIterator"
    with pytest.raises(NotImplementedError, match="PER_REPLICA"):
        strategy.distribute_datasets_from_function(
            bound,
            options=tf.distribute.InputOptions(
                experimental_fetch_to_device=False,
                experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
            ),
        )


def test_the_default_strategy_is_not_one_cpu_replica_and_has_no_worker_devices():
    # A pipeline trains under the default strategy: its distributed datasets are plain datasets
    # already, and asking it for worker_devices raises (what one_cpu_replica guards against).
    strategy = tf.distribute.get_strategy()
    with pytest.raises(RuntimeError, match="worker_devices"):
        strategy.extended.worker_devices  # noqa: B018
    assert not _compat.one_cpu_replica(strategy)
    fn = tfdist.data.load("digits", split="train", seed=0).bind(global_batch_size=64)
    assert isinstance(strategy.distribute_datasets_from_function(fn), tf.data.Dataset)


def test_plain_iterator_gives_the_same_batches_in_the_same_order():
    strategy = tfdist.make_strategy("one_device")
    assert _compat.one_cpu_replica(strategy)
    assert not _compat.one_cpu_replica(tfdist.make_strategy("mirrored"))  # 4 virtual CPUs
    # A finite input whose last batch is partial, and the digits.
    for fn in (
        lambda ctx: tf.data.Dataset.range(10).map(lambda i: (i, 2 * i)).batch(3),
        tfdist.data.load("digits", split="train", seed=0).bind(global_batch_size=100),
    ):
        _, default = _drain(strategy.distribute_datasets_from_function(fn))
        plain = _compat.plain_iterator(strategy.distribute_datasets_from_function(fn))
        iterator, batches = _drain(plain)
        assert type(iterator._iterators[0]._iterator).__name__ == "OwnedIterator"
        assert len(batches) == len(default) > 1
        for a, b in zip(tf.nest.flatten(batches), tf.nest.flatten(default)):
            np.testing.assert_array_equal(a, b)
    # Anything else (already given options, another class) is left as it is.
    given = strategy.distribute_datasets_from_function(fn, options=tf.distribute.InputOptions())
    assert _compat.plain_iterator(given)._options == tf.distribute.InputOptions()
