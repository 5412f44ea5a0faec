"""Pipeline stages (issue 35): exact against plain Keras on one device, stages placed on their
devices, evaluate and predict through the stages (the refusals: test_pipeline_refusals.py).

Everything runs in this process on the logical CPU devices of tests/conftest.py; each trainer
trains a few steps of a small MLP. Exactness, with SGD in float32: gradients to 5e-7 (one
update with learning rate 1 is the gradient), weights after further updates to 1e-6.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.helpers import REPO
from tfdist.training.pipeline.options import PipelineOptions, resolve_devices
from tfdist.training.pipeline.update import PipelineUpdate

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
RNG = np.random.default_rng(0)
X = RNG.normal(size=(76, 8)).astype("float32")  # 32 + 32 + 12: a partial last batch
Y = RNG.integers(0, 3, size=76)
SPLIT = ["d1", "d2"]  # three stages: d1 | d2 | d3, out


def mlp(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, activation="tanh", name="d1")(inputs)
    h = keras.layers.Dense(16, activation="tanh", name="d2", kernel_regularizer="l2")(h)
    h = keras.layers.Dense(16, activation="tanh", name="d3")(h)
    return keras.Model(inputs, keras.layers.Dense(3, name="out")(h))


def keras_reference(steps: int, epochs: int) -> tuple[keras.Model, list, dict]:
    """Plain Keras on one device: one SGD(1.0) step, then ``epochs`` at 0.1 (the pipeline's
    schedule in `pipelined`)."""
    model = mlp()
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss=LOSS, metrics=["accuracy"])
    w0 = model.get_weights()
    model.fit(X[:32], Y[:32], batch_size=32, epochs=steps, verbose=0, shuffle=False)
    grads = [a - b for a, b in zip(w0, model.get_weights())]
    model.optimizer.learning_rate.assign(0.1)
    history = model.fit(X, Y, batch_size=32, epochs=epochs, verbose=0, shuffle=False)
    return model, grads, history.history


@pytest.fixture(scope="module")
def reference():
    return keras_reference(1, 2)


def pipelined(micro_batches: int, **options) -> tuple[tfdist.Trainer, list, dict]:
    trainer = tfdist.Trainer(
        mlp,
        optimizer=keras.optimizers.SGD(1.0),
        loss=LOSS,
        metrics=["accuracy"],
        pipeline=PipelineOptions(split_at=SPLIT, micro_batches=micro_batches, **options),
    )
    w0 = trainer.model.get_weights()
    trainer.fit(X[:32], Y[:32], batch_size=32, epochs=1, verbose=0, shuffle=False)
    grads = [a - b for a, b in zip(w0, trainer.model.get_weights())]
    trainer.model.optimizer.learning_rate.assign(0.1)
    history = trainer.fit(X, Y, batch_size=32, epochs=2, verbose=0, shuffle=False)
    return trainer, grads, history.history


def max_diff(a: list, b: list) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def eight():
    """M=8: the last batch of 12 goes as 2, 2, 2, 2, 1, 1, 1, 1."""
    return pipelined(8)


@pytest.mark.parametrize("micro_batches", [1, 2, 4, 8, "4-1f1b", "8-1f1b"])
def test_equals_keras_on_one_device(micro_batches, reference, eight):
    """GPipe, and 1F1B (each stage's forward and backward in turn), equal one device."""
    ref_model, ref_grads, ref_history = reference
    if isinstance(micro_batches, str):
        m = int(micro_batches.split("-")[0])
        trainer, grads, history = pipelined(m, schedule="1f1b")
    else:
        trainer, grads, history = eight if micro_batches == 8 else pipelined(micro_batches)
    assert max_diff(grads, ref_grads) <= 5e-7
    assert max_diff(trainer.model.get_weights(), ref_model.get_weights()) <= 1e-6
    assert history.keys() == ref_history.keys()
    assert history["accuracy"] == ref_history["accuracy"]
    np.testing.assert_allclose(history["loss"], ref_history["loss"], rtol=1e-6)


def test_evaluate_and_predict_go_through_the_stages(reference, eight):
    ref_model, trainer = reference[0], eight[0]
    got = trainer.evaluate(X, Y, batch_size=32, verbose=0, return_dict=True)
    want = ref_model.evaluate(X, Y, batch_size=32, verbose=0, return_dict=True)
    assert got.keys() == want.keys()
    assert got["accuracy"] == want["accuracy"]
    assert abs(got["loss"] - want["loss"]) <= 1e-6
    predicted = trainer.predict(X, batch_size=32, verbose=0)
    assert max_diff([predicted], [ref_model.predict(X, batch_size=32, verbose=0)]) <= 1e-6
    stages = trainer.stages
    assert [s.device[-5:] for s in stages] == ["CPU:0", "CPU:1", "CPU:2"]


def test_stages_and_adam_slots_live_on_their_devices():
    """A Sequential built by the first fit (no Input), on devices given in reverse order."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.layers.Dense(8, name=n) for n in ("a", "b", "c")] + [keras.layers.Dense(3, name="d")]
    )
    devices = ["/device:CPU:3", "/device:CPU:2", "/device:CPU:1"]
    trainer = tfdist.Trainer(
        model,
        optimizer="adam",
        loss=LOSS,
        pipeline=PipelineOptions(split_at=["a", "c"], micro_batches=2, devices=devices),
    )
    trainer.fit(X[:32], Y[:32], batch_size=16, epochs=1, verbose=0)
    stage = {"a": 0, "b": 1, "c": 1, "d": 2}
    for v in model.variables:
        assert v.value.device.endswith(devices[stage[v.path.split("/")[-2]]][-5:]), v.path
    slots = [v for v in model.optimizer.variables if v.path.endswith(("_momentum", "_velocity"))]
    assert len(slots) == 2 * len(model.trainable_variables)
    for slot in slots:
        # e.g. "adam/sequential_3_b_kernel_momentum": the model's name varies with the run
        layer = re.search(r"(?:^|_)([abcd])_(?:kernel|bias)_", slot.path.split("/")[-1]).group(1)
        assert slot.value.device.endswith(devices[stage[layer]][-5:]), slot.path


def test_backward_runs_on_each_stages_device():
    """Every MatMul of the step, forward and backward, asks for its stage's device, and no
    control edge serialises the stages."""
    trainer = tfdist.Trainer(
        mlp, optimizer="sgd", loss=LOSS, pipeline=PipelineOptions(SPLIT, micro_batches=2)
    )
    trainer.evaluate(X[:4], Y[:4], verbose=0)  # builds the model and its stages
    update = PipelineUpdate(
        trainer.model,
        trainer.model.optimizer,
        stages=trainer.stages,
        micro_batches=2,
        global_batch_size=32,
        accumulation_steps=1,
        num_replicas=1,
    )
    spec = (tf.TensorSpec([32, 8]), tf.TensorSpec([32], tf.int64))
    graph = (
        tf.function(lambda x, y: update.micro_step((x, y))[0]).get_concrete_function(*spec).graph
    )
    devices = [op.device[-5:] for op in graph.get_operations() if op.type == "MatMul"]
    # Per micro-batch: stage 0 has d1 (forward, kernel gradient); stage 1 d2 (forward, kernel
    # and input gradients); stage 2 d3 and out (forward, kernel and input gradients each).
    assert sorted(devices) == sorted(["CPU:0"] * 4 + ["CPU:1"] * 6 + ["CPU:2"] * 12)
    # No automatic control dependency ties one stage's ops to another's: they can overlap.
    crossing = [
        (c.name, op.name)
        for op in graph.get_operations()
        for c in op.control_inputs
        if c.device and op.device and c.device != op.device
    ]
    assert not crossing


def test_default_devices_are_the_logical_cpus():
    assert [d[-5:] for d in resolve_devices(PipelineOptions(SPLIT))] == ["CPU:0", "CPU:1", "CPU:2"]


# --- the rest of Keras's fit: callbacks, validation, accumulation, several inputs and outputs ---


class Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(("batch", batch, dict(logs)))

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append(("epoch", epoch, dict(logs)))


def assert_same_logs(got: list, want: list) -> None:
    assert [(kind, i, sorted(logs)) for kind, i, logs in got] == [
        (kind, i, sorted(logs)) for kind, i, logs in want
    ]
    for (_, _, a), (_, _, b) in zip(got, want):
        for key in b:
            assert abs(a[key] - b[key]) <= 1e-6 * max(1.0, abs(b[key])), (key, a[key], b[key])


def test_callbacks_and_validation_see_keras_logs():
    fit = dict(batch_size=32, epochs=2, verbose=0, shuffle=False, validation_data=(X[:40], Y[:40]))
    ours, theirs = Record(), Record()
    trainer = tfdist.Trainer(
        mlp,
        optimizer=keras.optimizers.SGD(0.1),
        loss=LOSS,
        metrics=["accuracy"],
        pipeline=PipelineOptions(SPLIT, micro_batches=4),
    )
    history = trainer.fit(X, Y, callbacks=[ours], **fit)
    model = mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS, metrics=["accuracy"])
    want = model.fit(X, Y, callbacks=[theirs], **fit)
    assert_same_logs(ours.seen, theirs.seen)
    assert history.history.keys() == want.history.keys()
    assert trainer.steps_per_execution == 1  # batch hooks: every update seen


def test_accumulation_is_more_micro_batches():
    """2 updates' worth of batches accumulated: Keras's update on their 64 examples at once."""
    trainer = tfdist.Trainer(
        mlp,
        optimizer=keras.optimizers.SGD(0.5),
        loss=LOSS,
        accumulation_steps=2,
        pipeline=PipelineOptions(SPLIT, micro_batches=2),
    )
    trainer.fit(X[:64], Y[:64], batch_size=32, epochs=1, verbose=0, shuffle=False)
    model = mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
    model.fit(X[:64], Y[:64], batch_size=64, epochs=1, verbose=0, shuffle=False)
    assert max_diff(trainer.model.get_weights(), model.get_weights()) <= 1e-6


def two_in_two_out() -> keras.Model:
    keras.utils.set_random_seed(2)
    a, b = keras.Input((8,), name="a"), keras.Input((4,), name="b")
    h = keras.layers.Concatenate(name="join")([a, b])
    h = keras.layers.Dense(16, activation="relu", name="d1")(h)
    h = keras.layers.Dense(16, activation="relu", name="d2")(h)
    outputs = {
        "cls": keras.layers.Dense(3, name="cls")(h),
        "reg": keras.layers.Dense(1, name="reg")(h),
    }
    return keras.Model({"a": a, "b": b}, outputs)


def test_several_inputs_and_outputs():
    inputs = {"a": X[:64], "b": X[:64, :4] * 2}
    targets = {"cls": Y[:64], "reg": X[:64, :1]}
    compiled = dict(loss={"cls": LOSS, "reg": "mse"}, metrics={"cls": ["accuracy"]})
    trainer = tfdist.Trainer(
        two_in_two_out,
        optimizer=keras.optimizers.SGD(0.1),
        pipeline=PipelineOptions(["join", "d1"], micro_batches=4),
        **compiled,
    )
    got = trainer.fit(inputs, targets, batch_size=32, epochs=2, verbose=0, shuffle=False)
    model = two_in_two_out()
    model.compile(optimizer=keras.optimizers.SGD(0.1), **compiled)
    want = model.fit(inputs, targets, batch_size=32, epochs=2, verbose=0, shuffle=False)
    assert max_diff(trainer.model.get_weights(), model.get_weights()) <= 1e-6
    assert got.history.keys() == want.history.keys()
    for key, values in want.history.items():
        np.testing.assert_allclose(got.history[key], values, rtol=1e-6, err_msg=key)
    predicted = trainer.predict(inputs, batch_size=32, verbose=0)
    assert (
        max_diff([predicted["reg"]], [model.predict(inputs, batch_size=32, verbose=0)["reg"]])
        <= 1e-6
    )


def test_evaluate_keeps_a_mask_made_in_the_last_stage():
    """Keras masks reaching the outputs are concatenated with the micro-batches' outputs."""

    def masked() -> keras.Model:
        keras.utils.set_random_seed(3)
        inputs = keras.Input((6, 2))
        h = keras.layers.Activation("linear", name="lin")(inputs)
        h = keras.layers.Masking(0.0, name="mask")(h)
        return keras.Model(inputs, keras.layers.Dense(3, name="out")(h))

    x = RNG.normal(size=(64, 6, 2)).astype("float32")
    x[:, 4:], x[::3, 1:] = 0, 0
    y = RNG.integers(0, 3, size=(64, 6))
    trainer = tfdist.Trainer(
        masked, loss=LOSS, metrics=["accuracy"], pipeline=PipelineOptions(["lin"], micro_batches=4)
    )
    model = masked()
    model.compile(loss=LOSS, metrics=["accuracy"])
    got = trainer.evaluate(x, y, batch_size=32, verbose=0)
    np.testing.assert_allclose(got, model.evaluate(x, y, batch_size=32, verbose=0), rtol=1e-6)


def _masked_sequences() -> keras.Model:
    """Padded steps stay zero through stage 0 (no bias), and stage 1 masks them."""
    keras.utils.set_random_seed(3)
    inputs = keras.Input((6, 2))
    h = keras.layers.Dense(4, use_bias=False, name="lin")(inputs)
    h = keras.layers.Masking(0.0, name="mask")(h)
    h = keras.layers.Dense(4, activation="tanh", name="hid")(h)
    return keras.Model(inputs, keras.layers.Dense(3, name="out")(h))


@pytest.mark.parametrize("kind", ["keras_mask", "ignore_class", "accumulated"])
def test_masked_loss_terms_train_as_one_device_on_the_whole_batch(kind):
    """A Keras mask reaching the loss (made in the last stage), or ``ignore_class``: each term
    weighed by its valid count over the whole update, not per micro-batch, so 4 micro-batches
    of uneven valid counts equal plain Keras on the whole batch (SGD, float32); accumulated:
    2 batches of 16 per update against Keras's batches of 32."""
    x = RNG.normal(size=(64, 6, 2)).astype("float32")
    x[:, 4:], x[::3, 1:] = 0, 0  # uneven valid steps across the micro-batches
    y = RNG.integers(0, 3, size=(64, 6))
    loss = LOSS
    if kind == "ignore_class":
        y[::5, 2:] = -1
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-1)
    fit = dict(batch_size=32, epochs=2, verbose=0, shuffle=False)
    k = 2 if kind == "accumulated" else 1
    trainer = tfdist.Trainer(
        _masked_sequences,
        optimizer=keras.optimizers.SGD(0.5),
        loss=loss,
        metrics=["accuracy"],
        accumulation_steps=k,
        pipeline=PipelineOptions(["lin"], micro_batches=4),
    )
    got = trainer.fit(x, y, **{**fit, "batch_size": 32 // k}).history
    model = _masked_sequences()
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss, metrics=["accuracy"])
    want = model.fit(x, y, **fit).history
    assert max_diff(trainer.model.get_weights(), model.get_weights()) <= 1e-6
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)


def test_activity_regularizers_in_every_stage_train_as_keras():
    """An activity loss made in stage 0 or 1 reaches that stage's gradients (its coefficient
    read from the last stage's loss), with 4 micro-batches: plain Keras on one device (SGD)."""

    def regularised() -> keras.Model:
        keras.utils.set_random_seed(5)
        inputs = keras.Input((8,))
        h = keras.layers.Dense(16, activation="tanh", name="d1", activity_regularizer="l2")(inputs)
        h = keras.layers.Dense(16, activation="tanh", name="d2", activity_regularizer="l1")(h)
        h = keras.layers.Dense(16, activation="tanh", name="d3", activity_regularizer="l2")(h)
        return keras.Model(inputs, keras.layers.Dense(3, name="out")(h))

    fit = dict(batch_size=32, epochs=2, verbose=0, shuffle=False)
    trainer = tfdist.Trainer(
        regularised,
        optimizer=keras.optimizers.SGD(0.5),
        loss=LOSS,
        pipeline=PipelineOptions(SPLIT, micro_batches=4),
    )
    got = trainer.fit(X[:64], Y[:64], **fit).history
    model = regularised()
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
    want = model.fit(X[:64], Y[:64], **fit).history
    assert max_diff(trainer.model.get_weights(), model.get_weights()) <= 1e-6
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)


def test_split_at_auto_cuts_by_parameter_bytes():
    """``split_at="auto"``: the cuts that make the heaviest stage lightest (d1 | d2 | d3, out:
    144, 272 and 323 floats), trained exactly as the same cuts by name."""
    auto = tfdist.Trainer(
        mlp, optimizer="sgd", loss=LOSS, pipeline=PipelineOptions("auto", stages=3, micro_batches=2)
    )
    named = tfdist.Trainer(
        mlp, optimizer="sgd", loss=LOSS, pipeline=PipelineOptions(SPLIT, micro_batches=2)
    )
    for trainer in (auto, named):
        trainer.fit(X[:64], Y[:64], batch_size=32, epochs=1, verbose=0, shuffle=False)
    assert [[x.name for x in s.model.layers[1:]] for s in auto.stages] == [
        ["d1"],
        ["d2"],
        ["d3", "out"],
    ]
    assert max_diff(auto.model.get_weights(), named.model.get_weights()) == 0.0


def _wide(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((16,))
    h = keras.layers.Dense(512, activation="relu", name="w1")(inputs)
    h = keras.layers.Dense(512, activation="relu", name="w2")(h)
    h = keras.layers.Dense(512, activation="relu", name="w3")(h)
    return keras.Model(inputs, keras.layers.Dense(3, name="wo")(h))


def one_f_one_b_peak() -> int:
    """The TF allocator's peak over a second 1F1B fit of `_wide` (bytes above its start)."""
    x = RNG.normal(size=(4096, 16)).astype("float32")
    y = RNG.integers(0, 3, size=4096)
    trainer = tfdist.Trainer(
        _wide,
        optimizer="sgd",
        loss=LOSS,
        pipeline=PipelineOptions(["w2"], micro_batches=32, schedule="1f1b"),
    )
    trainer.fit(x, y, batch_size=4096, epochs=1, verbose=0)  # traced
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    trainer.fit(x, y, batch_size=4096, epochs=1, verbose=0)
    return tf.config.experimental.get_memory_info("CPU:0")["peak"] - before


def test_1f1b_holds_the_activations_of_few_micro_batches():
    """1F1B bounds what a stage holds: stage 0 (of 2) at most 2 micro-batches' activations.
    The allocator's peak over a step of 4096 examples in 32 micro-batches stays under half of
    the whole batch's activations (3 layers x 2 tensors x 4096 x 512 floats, 48 MiB): GPipe's
    order leaves it to TF's executor, which held 66 MiB here (and 90-510 MiB in larger runs).

    TF keeps allocator counts on the CPU only with oneDNN's allocator, which TF turns on for
    CPUs with AVX-512 or AMX; elsewhere (an AVX2-only CPU) the measurement runs in a process
    of its own under TF's BFC allocator, which counts every tensor."""
    try:
        tf.config.experimental.reset_memory_stats("CPU:0")
        peak = one_f_one_b_peak()
    except ValueError:  # "Cannot reset memory stats": no allocator counts in this process
        code = (
            "import tensorflow as tf; c = tf.config; cpu = c.list_physical_devices('CPU')[0]; "
            "c.set_logical_device_configuration(cpu, [c.LogicalDeviceConfiguration()] * 2); "
            "from tests.training.pipeline.test_pipeline import one_f_one_b_peak as p; print(p())"
        )
        env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPP_MIN_LOG_LEVEL": "2"}
        env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        peak = int(done.stdout.split()[-1])
    assert peak < 24 * 2**20, f"{peak / 2**20:.1f} MiB"


def test_sample_weights():
    weights = RNG.uniform(0.0, 2.0, size=64).astype("float32")
    fit = dict(sample_weight=weights, batch_size=32, epochs=1, verbose=0, shuffle=False)
    trainer = tfdist.Trainer(
        mlp,
        optimizer=keras.optimizers.SGD(0.5),
        loss=LOSS,
        pipeline=PipelineOptions(SPLIT, micro_batches=4),
    )
    got = trainer.fit(X[:64], Y[:64], **fit)
    model = mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
    want = model.fit(X[:64], Y[:64], **fit)
    assert max_diff(trainer.model.get_weights(), model.get_weights()) <= 1e-6
    np.testing.assert_allclose(got.history["loss"], want.history["loss"], rtol=1e-6)


@pytest.mark.parametrize("policy,tolerance", [("mixed_bfloat16", 1e-3), ("mixed_float16", 1e-4)])
def test_mixed_precision_matches_keras_under_the_same_policy(policy, tolerance):
    """Each stage computes in the policy's 16-bit type over float32 weights, as Keras does on
    one device; mixed_float16 scales the loss (Keras's dynamic ``LossScaleOptimizer``, the same
    scale after the same updates). The tolerances are of 16-bit rounding: bf16's 8-bit mantissa
    moves Keras's own weights by 2e-4 from float32's here, and the micro-batches round their
    partial sums apart from the whole batch's (measured: 2.9e-4 bf16, 1.7e-5 fp16).

    Not the same as Keras: with a loss scale so high that the whole batch's float16 gradient
    overflows where each micro-batch's does not (they are summed in float32), the pipeline
    applies an update that Keras skips (seen with ``initial_scale=2**20``: 8 updates of 9
    against Keras's 7), as gradient accumulation would.
    """
    fit = dict(batch_size=32, epochs=3, verbose=0, shuffle=False)
    trainer = tfdist.Trainer(
        mlp,
        optimizer=keras.optimizers.SGD(0.1),
        loss=LOSS,
        precision=policy,
        pipeline=PipelineOptions(SPLIT, micro_batches=4),
    )
    got = trainer.fit(X, Y, **fit)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        model = mlp()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
        want = model.fit(X, Y, **fit)
    finally:
        keras.config.set_dtype_policy(previous)
    compute = "bfloat16" if policy == "mixed_bfloat16" else "float16"
    for stage in trainer.stages:
        assert {x.compute_dtype for x in stage.model.layers[1:]} == {compute}
    assert {w.dtype for w in trainer.model.get_weights()} == {np.dtype("float32")}
    assert max_diff(trainer.model.get_weights(), model.get_weights()) <= tolerance
    # The loss log at bf16's rounding too: 2.5e-4 apart on an AVX2-only CPU (no oneDNN).
    loss_rtol = 1e-3 if policy == "mixed_bfloat16" else 1e-4
    np.testing.assert_allclose(got.history["loss"], want.history["loss"], rtol=loss_rtol)
    if policy == "mixed_float16":
        ours, theirs = trainer.model.optimizer, model.optimizer
        assert isinstance(ours, keras.optimizers.LossScaleOptimizer)
        assert float(ours.dynamic_scale.numpy()) == float(theirs.dynamic_scale.numpy())
        assert int(ours.iterations.numpy()) == int(theirs.iterations.numpy()) == 9
