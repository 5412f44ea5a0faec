"""Pipelines over real transformers (issue 41): side inputs that several stages need travel with
the activations (Keras masks too), nested backbones are cut between their layers, a tied
embedding is in two stages, embeddings' gradients stay ``tf.IndexedSlices``.

Each test trains a tiny transformer cut into stages on the logical CPU devices of
tests/conftest.py against plain Keras ``fit`` on one device with the same global batch, in
float32: weights to 1e-5 with SGD and with Adam (measured: about 1e-7).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.training.pipeline.auto_split import balanced_split
from tfdist.training.pipeline.options import PipelineOptions
from tfdist.training.pipeline.update import PipelineUpdate

VOCAB, SEQ, WIDTH = 13, 8, 8
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
RNG = np.random.default_rng(4)
IDS = RNG.integers(1, VOCAB, size=(32, SEQ)).astype("int32")  # tokens repeat in every batch
PAD = np.ones((32, SEQ), "int32")
PAD[::3, 6:] = 0  # padded ends: the padding mask matters
POSITIONS = np.tile(np.arange(SEQ, dtype="int32"), (32, 1))
TARGETS = np.roll(IDS, -1, axis=1)
CAUSAL = np.tril(np.ones((SEQ, SEQ), bool))


def optimizer(kind: str) -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(0.5) if kind == "sgd" else keras.optimizers.Adam(0.01)


def max_diff(a: list, b: list) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def tiny_lm(seed: int = 0) -> keras.Model:
    """A 2-block pre-LN causal LM: token and position embeddings, one attention mask (causal and
    padding, made from the ``padding_mask`` input) read by both blocks, residual streams."""
    keras.utils.set_random_seed(seed)
    ids = keras.Input((SEQ,), dtype="int32", name="token_ids")
    pad = keras.Input((SEQ,), dtype="int32", name="padding_mask")
    positions = keras.Input((SEQ,), dtype="int32", name="position_ids")
    tokens = keras.layers.Embedding(VOCAB, WIDTH, name="tokens")(ids)
    h = keras.layers.Add(name="embed")([tokens, keras.layers.Embedding(SEQ, WIDTH)(positions)])
    mask = keras.ops.logical_and(keras.ops.cast(pad[:, None, :], "bool"), CAUSAL)
    for i in range(2):
        a = keras.layers.LayerNormalization(name=f"ln_{i}")(h)
        # No biases: a key bias's gradient is rounding noise, which Adam turns into steps.
        a = keras.layers.MultiHeadAttention(2, WIDTH // 2, use_bias=False, name=f"attn_{i}")(
            a, a, attention_mask=mask
        )
        h = keras.layers.Add(name=f"res_{i}")([h, a])
        f = keras.layers.LayerNormalization(name=f"ln2_{i}")(h)
        f = keras.layers.Dense(2 * WIDTH, activation="gelu", name=f"ff_{i}")(f)
        h = keras.layers.Add(name=f"block_{i}")([h, keras.layers.Dense(WIDTH, name=f"proj_{i}")(f)])
    h = keras.layers.LayerNormalization(name="ln_f")(h)
    return keras.Model([ids, pad, positions], keras.layers.Dense(VOCAB, name="head")(h))


def trained(make, x, kind: str, pipeline: PipelineOptions | None, **fit) -> tuple:
    """(model, history) of ``make()`` trained by plain Keras (``pipeline=None``) or tfdist."""
    if pipeline is None:
        model = make()
        model.compile(optimizer=optimizer(kind), loss=LOSS)
        return model, model.fit(x, TARGETS, **fit).history
    trainer = tfdist.Trainer(make, optimizer=optimizer(kind), loss=LOSS, pipeline=pipeline)
    return trainer, trainer.fit(x, TARGETS, **fit).history


FIT = dict(batch_size=16, epochs=2, verbose=0, shuffle=False)


@pytest.mark.parametrize("kind", ["adam"])  # SGD: the KerasHub GPT-2 case below
def test_transformer_lm_cut_between_blocks_equals_keras(kind):
    """Cut after block 0: the attention mask (made in stage 0) and the padding mask's input
    cross with the residual stream; Adam sees the embedding's rows as Keras does."""
    x = [IDS, PAD, POSITIONS]
    want, want_history = trained(tiny_lm, x, kind, None, **FIT)
    options = PipelineOptions(["block_0"], micro_batches=2)
    trainer, history = trained(tiny_lm, x, kind, options, **FIT)
    assert max_diff(trainer.model.get_weights(), want.get_weights()) <= 1e-5
    np.testing.assert_allclose(history["loss"], want_history["loss"], rtol=1e-5)
    crossing = [(t.dtype, tuple(t.shape)) for t in trainer.stages[1].model.inputs]
    assert sorted(crossing, key=str) == [
        ("bool", (None, SEQ, SEQ)),
        ("float32", (None, SEQ, WIDTH)),
    ]
    if kind == "adam":  # through the stages: the model's own outputs on the same weights
        logits = trainer.model(x).numpy()
        got = trainer.evaluate(x, TARGETS, batch_size=16, verbose=0)
        assert abs(got - float(LOSS(TARGETS, logits))) <= 1e-5
        assert max_diff([trainer.predict(x, batch_size=16, verbose=0)], [logits]) <= 1e-5


def test_a_residual_stream_travels_through_a_stage_that_does_not_read_it():
    """Three stages, cut after block 0 and inside block 1 (after its attention): the residual
    stream crosses the second cut beside the attention's output, and stage 1 passes stage 2
    the mask it read; 1F1B, SGD."""
    x = [IDS, PAD, POSITIONS]
    fit = dict(FIT, epochs=1)
    want, want_history = trained(tiny_lm, x, "sgd", None, **fit)
    options = PipelineOptions(["block_0", "attn_1"], micro_batches=2, schedule="1f1b")
    trainer, history = trained(tiny_lm, x, "sgd", options, **fit)
    assert max_diff(trainer.model.get_weights(), want.get_weights()) <= 1e-5
    np.testing.assert_allclose(history["loss"], want_history["loss"], rtol=1e-5)
    assert [len(s.model.inputs) for s in trainer.stages] == [3, 2, 2]
    assert [x.name for x in trainer.stages[2].model.layers if x.weights][:1] == ["ln2_1"]


def gpt2(seed: int = 0) -> keras.Model:
    """KerasHub's GPT-2 backbone (random weights, from its constructor) with an untied head."""
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_heads=2,
        hidden_dim=WIDTH,
        intermediate_dim=2 * WIDTH,
        max_sequence_length=16,
        dropout=0.0,
        name="backbone",
    )
    inputs = backbone.input
    return keras.Model(inputs, keras.layers.Dense(VOCAB, name="head")(backbone(inputs)))


def hub_backbone(family: str) -> keras.Model:
    """KerasHub's Llama (grouped-query attention, rotary positions) or BERT (a segment input,
    a dict of outputs) backbone of 2 layers with an untied head, from its constructor."""
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(0)
    sizes = dict(vocabulary_size=VOCAB, num_layers=2, hidden_dim=WIDTH, dropout=0.0)
    sizes.update(intermediate_dim=2 * WIDTH, name="backbone")
    if family == "llama":
        backbone = keras_hub.models.LlamaBackbone(num_query_heads=2, num_key_value_heads=1, **sizes)
        out = backbone(backbone.input)
    else:
        backbone = keras_hub.models.BertBackbone(num_heads=2, max_sequence_length=16, **sizes)
        out = backbone(backbone.input)["sequence_output"]
    return keras.Model(backbone.input, keras.layers.Dense(VOCAB, name="head")(out))


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_keras_hub_backbones_cut_between_their_transformer_layers(family):
    """The nested backbone is flattened: ``backbone/transformer_layer_0`` names its first
    transformer layer, and the padding mask (BERT's segment ids too) travels to the second;
    SGD (Adam through stages: the transformer LM above)."""
    x = {"token_ids": IDS, "padding_mask": PAD}
    if family == "bert":
        x["segment_ids"] = (np.arange(SEQ) >= SEQ // 2).astype("int32") * PAD
    make = gpt2 if family == "gpt2" else lambda: hub_backbone(family)
    want, want_history = trained(make, x, "sgd", None, **FIT)
    options = PipelineOptions(["backbone/transformer_layer_0"], micro_batches=2)
    trainer, history = trained(make, x, "sgd", options, **FIT)
    assert max_diff(trainer.model.get_weights(), want.get_weights()) <= 1e-5
    np.testing.assert_allclose(history["loss"], want_history["loss"], rtol=1e-5)
    names = [[x.name for x in s.model.layers if x.weights] for s in trainer.stages]
    assert names[0][-1] == "transformer_layer_0"
    assert names[1][0] == "transformer_layer_1" and names[1][-1] == "head"


def test_split_at_auto_cuts_inside_the_nested_backbone():
    """``split_at="auto"`` chooses among the backbone's own layers (by parameter bytes)."""
    model = gpt2()
    assert balanced_split(model, 2) == ["backbone/transformer_layer_0"]
    assert balanced_split(model, 4)[1:] == [
        "backbone/transformer_layer_0",
        "backbone/transformer_layer_1",
    ]


def test_keras_hub_gpt2_causal_lm_with_its_tied_embedding():
    """``GPT2CausalLM`` itself: its head reads the backbone's token embedding again, so that
    variable is in both stages (it lives on stage 0's device) and each stage's backward adds
    the gradient of its own read; SGD."""
    keras_hub = pytest.importorskip("keras_hub")

    def causal_lm() -> keras.Model:
        backbone = gpt2().layers[-2]
        return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)

    x = {"token_ids": IDS, "padding_mask": PAD}
    fit = dict(FIT, epochs=1)
    want, want_history = trained(causal_lm, x, "sgd", None, **fit)
    options = PipelineOptions(["backbone/transformer_layer_0"], micro_batches=2)
    trainer, history = trained(causal_lm, x, "sgd", options, **fit)
    assert max_diff(trainer.model.get_weights(), want.get_weights()) <= 1e-5
    np.testing.assert_allclose(history["loss"], want_history["loss"], rtol=1e-5)
    embedding = trainer.model.backbone.token_embedding
    assert embedding in trainer.stages[1].model.layers
    assert embedding.embeddings.value.device.endswith("CPU:0")


MASKED_IDS = IDS % 6
MASKED_IDS[::3, 4:] = 0
MASKED_IDS[::5, 2:] = 0  # uneven valid steps across the micro-batches


def masked(kind: str) -> keras.Model:
    """``Embedding(mask_zero=True)`` in stage 0; its Keras mask is read by a GRU in stage 1
    (``"gru"``), or reaches the loss through stage 1's Dense layers (``"labeller"``)."""
    keras.utils.set_random_seed(2)
    inputs = keras.Input((SEQ,), dtype="int32")
    h = keras.layers.Embedding(6, 4, mask_zero=True, name="emb")(inputs)
    if kind == "gru":
        h = keras.layers.GRU(4, name="gru")(h)
    else:
        h = keras.layers.Dense(4, activation="tanh", name="hid")(h)
    return keras.Model(inputs, keras.layers.Dense(3, name="out")(h))


@pytest.mark.parametrize("kind", ["labeller"])  # "gru" works too (2e-8), at 4x the CPU
def test_a_keras_mask_crosses_a_cut(kind):
    """Cut after the masking embedding: the mask crosses with its output (Adam; the labeller's
    masked loss terms weighed over the whole update, the embedding's rows with them)."""
    y = TARGETS[:, 0] % 3 if kind == "gru" else TARGETS % 3
    fit = dict(FIT, epochs=1)

    def run(pipeline):
        made = (
            tfdist.Trainer(lambda: masked(kind), pipeline=pipeline, **compiled)
            if pipeline
            else masked(kind)
        )
        if not pipeline:
            made.compile(**compiled)
        return made, made.fit(MASKED_IDS, y, **fit).history

    compiled = dict(optimizer=keras.optimizers.Adam(0.01), loss=LOSS, metrics=["accuracy"])
    want, want_history = run(None)
    compiled["optimizer"] = keras.optimizers.Adam(0.01)
    trainer, history = run(PipelineOptions(["emb"], micro_batches=2))
    assert max_diff(trainer.model.get_weights(), want.get_weights()) <= 1e-5
    for key, values in want_history.items():
        np.testing.assert_allclose(history[key], values, rtol=1e-5, err_msg=key)
    got = trainer.evaluate(MASKED_IDS, y, batch_size=16, verbose=0)
    np.testing.assert_allclose(got, want.evaluate(MASKED_IDS, y, batch_size=16, verbose=0), 1e-5)


def test_an_embeddings_gradient_reaches_the_optimizer_as_slices():
    """The token embedding's gradient over 2 micro-batches is one ``tf.IndexedSlices`` of every
    token of the batch (rows concatenated, duplicates kept), as Keras hands it on one device."""
    trainer = tfdist.Trainer(
        tiny_lm, optimizer="sgd", loss=LOSS, pipeline=PipelineOptions(["block_0"], micro_batches=2)
    )
    x = (IDS[:16], PAD[:16], POSITIONS[:16])
    trainer.evaluate(list(x), TARGETS[:16], verbose=0)  # builds the model and its stages
    update = PipelineUpdate(
        trainer.model,
        trainer.model.optimizer,
        stages=trainer.stages,
        micro_batches=2,
        global_batch_size=16,
        accumulation_steps=1,
        num_replicas=1,
    )
    grads = update.micro_step((x, TARGETS[:16]))[0]
    variables = trainer.model.trainable_variables
    tokens = grads[next(i for i, v in enumerate(variables) if v.path == "tokens/embeddings")]
    assert isinstance(tokens, tf.IndexedSlices)
    np.testing.assert_array_equal(tokens.indices.numpy(), IDS[:16].reshape(-1))
