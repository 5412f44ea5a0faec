"""Tests for tfdist.models: every builder, float32 logits under mixed precision, CNN on digits."""

import keras
import numpy as np
import pytest

import tfdist.config
import tfdist.data
import tfdist.models


@pytest.fixture(params=["float32", "mixed_bfloat16"])
def dtype_policy(request):
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(request.param)
    yield request.param
    keras.config.set_dtype_policy(previous)


def test_available():
    assert tfdist.models.available() == ("cnn", "convnet", "gpt", "mlp", "resnet", "transformer")
    assert set(tfdist.models.available()) == set(tfdist.config.MODEL_NAMES)  # the CLI's list


@pytest.mark.parametrize("name", ["mlp", "cnn", "convnet", "resnet", "transformer"])
def test_builds_and_outputs_float32_logits(name, dtype_policy):
    model = tfdist.models.get(name, input_shape=(8, 8, 1), num_classes=10)
    assert isinstance(model, keras.Model) and model.name == name
    logits = model(np.random.default_rng(0).random((5, 8, 8, 1), dtype=np.float32), training=False)
    assert tuple(logits.shape) == (5, 10)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert model.layers[-1].dtype_policy.name == "float32"
    # Every other layer follows the global policy (nothing else is pinned to float32).
    compute_dtypes = {layer.compute_dtype for layer in model.layers[1:-1]}
    expected = "bfloat16" if dtype_policy == "mixed_bfloat16" else "float32"
    assert compute_dtypes == {expected}


def test_other_shapes_and_options():
    assert tfdist.models.get("mlp", input_shape=(20,), num_classes=3).output_shape == (None, 3)
    wide = tfdist.models.get("mlp", hidden_units=(2048, 2048, 2048))
    assert [layer.units for layer in wide.layers if isinstance(layer, keras.layers.Dense)] == [
        2048,
        2048,
        2048,
        10,
    ]
    assert (
        tfdist.models.get("cnn", input_shape=(28, 28, 1), dropout=0.5).get_layer("dropout").rate
        == 0.5
    )
    resnet = tfdist.models.get("resnet", num_blocks=3)
    assert (
        sum(isinstance(layer, keras.layers.BatchNormalization) for layer in resnet.layers)
        == 1 + 2 * 3
    )
    transformer = tfdist.models.get("transformer", input_shape=(16, 16, 3), num_layers=1)
    assert (
        sum(isinstance(layer, keras.layers.MultiHeadAttention) for layer in transformer.layers) == 1
    )
    assert transformer.output_shape == (None, 10)
    # Its parameters do not grow with the image (a global max-pool, no Dense over space).
    small, large = (
        tfdist.models.get("convnet", input_shape=(side, side, 3), filters=(8, 16))
        for side in (16, 64)
    )
    assert small.count_params() == large.count_params()
    assert large.output_shape == (None, 10)


def test_unknown_name_and_options():
    with pytest.raises(ValueError) as e:
        tfdist.models.get("vgg")
    assert str(e.value) == (
        "Invalid value for argument `model`. Received: model='vgg'. "
        "Expected one of: cnn, convnet, gpt, mlp, resnet, transformer."
    )
    with pytest.raises(
        ValueError,
        match="argument `num_blocks`.*Expected an option of model 'mlp': hidden_units, dropout",
    ):
        tfdist.models.get("mlp", num_blocks=3)
    with pytest.raises(ValueError, match="argument `input_shape`"):
        tfdist.models.get("cnn", input_shape=(64,))
    with pytest.raises(ValueError, match="argument `d_model`.*multiple of num_heads"):
        tfdist.models.get("transformer", d_model=30)
    with pytest.raises(ValueError, match="argument `num_classes`"):
        tfdist.models.get("cnn", num_classes=0)
    for filters in ((), 32, (32, 0)):
        with pytest.raises(ValueError, match="`filters`.*a non-empty sequence of positive ints"):
            tfdist.models.get("convnet", filters=filters)


def test_cnn_learns_digits():
    keras.utils.set_random_seed(0)
    model = tfdist.models.get("cnn")
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    train = tfdist.data.load("digits", split="train", global_batch_size=128)
    val = tfdist.data.load("digits", split="validation", global_batch_size=128)
    history = model.fit(train(), validation_data=val(), epochs=10, shuffle=False, verbose=0)
    assert max(history.history["val_accuracy"][-3:]) >= 0.95
    predictions = np.argmax(
        model.predict(np.stack([x for x, _ in _digits_validation()]), verbose=0), axis=1
    )
    assert np.mean(predictions == np.array([y for _, y in _digits_validation()])) >= 0.95


def _digits_validation():
    ((x, y),) = list(tfdist.data.load("digits", split="validation", global_batch_size=360)())
    return list(zip(x.numpy(), y.numpy()))


@pytest.mark.parametrize(
    "field,value",
    [("model", "vgg"), ("dataset", "imagenet"), ("dataset", "tfds:"), ("dataset", None)],
)
def test_train_config_checks_model_and_dataset_names(field, value):
    # TrainConfig (what `tfdist train` builds before TensorFlow loads) checks the same lists.
    with pytest.raises(ValueError, match=f"argument `{field}`. Received: {field}={value!r}"):
        tfdist.config.TrainConfig(**{field: value})
    assert tfdist.config.TrainConfig(dataset="tfds:mnist").dataset == "tfds:mnist"
