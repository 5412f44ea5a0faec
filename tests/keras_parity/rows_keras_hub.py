"""Parity rows for KerasHub's own transformers, built from their constructors (no download).

GPT-2 (its token embedding tied to the output: a dense gradient), BERT (a segment embedding: a
sparse one) and Llama (an untied token embedding: sparse; grouped-query attention, rotary
positions) as tiny backbones with random weights, trained with Adam as a language model or a
classifier. Dropout is off (its randomness differs between any two runs). ``keras_hub`` is
imported inside the builders: only the processes that build these rows pay for it.
"""

import keras
import numpy as np

from tests.keras_parity.parity import SYNC_STRATEGIES as SYNC
from tests.keras_parity.parity import Row, fixed_weights

VOCAB, SEQ, WIDTH, N = 23, 8, 8, 32
SIZES = dict(num_layers=1, hidden_dim=WIDTH, intermediate_dim=2 * WIDTH)  # 1 layer: half the trace


def _inputs(segments=False):
    ids = keras.Input((SEQ,), dtype="int32", name="token_ids")
    inputs = {
        "token_ids": ids,
        "padding_mask": keras.Input((SEQ,), dtype="int32", name="padding_mask"),
    }
    if segments:
        inputs["segment_ids"] = keras.Input((SEQ,), dtype="int32", name="segment_ids")
    return inputs


def gpt2_lm():
    """GPT-2's backbone and its tied output projection: next-token logits."""
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCAB, num_heads=2, max_sequence_length=SEQ, dropout=0.0, **SIZES
    )
    inputs = _inputs()
    logits = backbone.token_embedding(backbone(inputs), reverse=True)
    return fixed_weights(keras.Model(inputs, logits))


def llama_lm():
    """A Llama backbone (grouped-query attention, rotary positions) and its untied head."""
    import keras_hub

    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=VOCAB, num_query_heads=2, num_key_value_heads=1, dropout=0.0, **SIZES
    )
    inputs = _inputs()
    logits = backbone.token_embedding(backbone(inputs), reverse=True)
    return fixed_weights(keras.Model(inputs, logits))


def bert_classifier():
    """A BERT backbone with a classifier on its pooled output."""
    import keras_hub

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=VOCAB, num_heads=2, max_sequence_length=SEQ, dropout=0.0, **SIZES
    )
    inputs = _inputs(segments=True)
    logits = keras.layers.Dense(3)(backbone(inputs)["pooled_output"])
    return fixed_weights(keras.Model(inputs, logits))


def tokens(n=N, seed=0, segments=False):
    """Padded token ids (every token repeats in a batch) with their padding mask."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, (n, SEQ + 1)).astype(np.int32)
    lengths = rng.integers(4, SEQ + 2, n)
    mask = (np.arange(SEQ + 1) < lengths[:, None]).astype(np.int32)
    ids *= mask
    x = {"token_ids": ids[:, :-1], "padding_mask": mask[:, :-1]}
    if segments:
        x["segment_ids"] = (np.arange(SEQ) >= SEQ // 2).astype(np.int32) * mask[:, :-1]
    return x, ids[:, 1:]


def lm_fit():
    x, y = tokens()
    return dict(x=x, y=y, batch_size=8, epochs=2, shuffle=False)


def classifier_fit():
    x, _ = tokens(segments=True)
    labels = (x["token_ids"].sum(axis=1) % 3).astype(np.int32)
    return dict(x=x, y=labels, batch_size=8, epochs=2, shuffle=False)


def adam():
    # epsilon 1e-4, not 1e-7: an attention key bias's gradient is zero up to rounding (softmax
    # ignores a shift), and Adam with a tiny epsilon turns that noise into full steps, even
    # between Keras's own strategies. The embeddings' rows still reach Adam's squares.
    return dict(
        optimizer=keras.optimizers.Adam(0.01, epsilon=1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


ROWS = [
    Row("keras_hub_gpt2_lm_adam", gpt2_lm, adam, lm_fit, strategies=SYNC, slow=True),
    Row("keras_hub_llama_lm_adam", llama_lm, adam, lm_fit, strategies=SYNC, slow=True),
    Row(
        "keras_hub_bert_classifier_adam",
        bert_classifier,
        adam,
        classifier_fit,
        strategies=SYNC,
        slow=True,
    ),
]
