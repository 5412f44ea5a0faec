"""``sparse_exchange``: the bytes an embedding's gradient sends, as rows or dense, and its speed.

A 32,768-row embedding (64 wide) feeds a pooled classifier, mirrored over 2 CPU devices;
each global batch of 64 sequences of 8 tokens draws its tokens from 2% of the rows, so a
batch touches at most 2% of them (a language model's batch over a large vocabulary). Two
``tfdist.Trainer`` sides, from the same weights, SGD (linear in the gradient, so both give
the same weights):

* **rows** (``ExchangeOptions(sparse="auto")``, the default): the embedding's
  ``tf.IndexedSlices`` are gathered from every replica, indices and values;
* **dense** (``ExchangeOptions(sparse="dense")``): summed into a dense ``32768 x 64``
  gradient first and all-reduced.

The bytes are counted on one batch's real gradients in replica context: the rows side sends
each replica's rows (values, int64 indices) and its row count; the dense side the whole
gradient. ``bytes_ratio`` = rows / dense, summed over the replicas; goal <= 0.10. The
weights after the timed fits are compared (``max_weight_difference``), and the sides'
examples/s give ``speed_ratio`` (rows / dense).

    tfdist bench --benchmarks=sparse_exchange
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfdist.bench.harness import common, fits, timing

ROWS, WIDTH, SEQUENCE, GLOBAL_BATCH, CLASSES = 32_768, 64, 8, 64, 4
TOUCHED = 0.02  # the share of the rows a batch's tokens come from
SIDES = {"rows": "auto", "dense": "dense"}


def builder() -> keras.Model:
    """The embedding classifier, seeded weights (NumPy, so every side starts alike)."""
    ids = keras.Input((SEQUENCE,), dtype="int32")
    h = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(ROWS, WIDTH)(ids))
    model = keras.Model(ids, keras.layers.Dense(CLASSES)(h))
    rng = np.random.default_rng(0)
    model.set_weights([0.1 * rng.standard_normal(w.shape).astype("float32") for w in model.weights])
    return model


def data(batches: int) -> tf.data.Dataset:
    """``batches`` global batches whose tokens come from the first 2% of the rows."""
    rng = np.random.default_rng(1)
    n = batches * GLOBAL_BATCH
    ids = rng.integers(0, int(ROWS * TOUCHED), (n, SEQUENCE)).astype(np.int32)
    labels = rng.integers(0, CLASSES, n).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((ids, labels)).batch(GLOBAL_BATCH).cache()


def exchanged_bytes(strategy: tf.distribute.Strategy, batch: Any) -> dict[str, float]:
    """Bytes the embedding's gradient sends per update, summed over the replicas, each way."""
    from tfdist.training.step.exchange import sparse_bytes

    with strategy.scope():
        model = builder()
    loss_fn = fits.logits_loss()
    table = model.layers[1].embeddings

    def replica(ids: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(ids))
        grad = tape.gradient(loss, table)
        dense = float(np.prod(table.shape)) * tf.as_dtype(table.dtype).size
        return sparse_bytes(grad), tf.constant(dense)

    rows, dense = strategy.run(tf.function(replica), args=batch)
    total = [float(strategy.reduce("SUM", v, axis=None)) for v in (rows, dense)]
    return {"rows": total[0], "dense": total[1]}


def side_trainers(strategy: tf.distribute.Strategy) -> dict[str, Any]:
    """One Trainer per side of `SIDES`: the same model and weights, SGD."""
    import tfdist

    return {
        name: tfdist.Trainer(
            builder,
            strategy=strategy,
            optimizer=keras.optimizers.SGD(0.5),
            loss=fits.logits_loss(),
            exchange=tfdist.ExchangeOptions(sparse=mode),
            steps_per_execution=4,
        )
        for name, mode in SIDES.items()
    }


@common.register("sparse_exchange")
def sparse_exchange(repeats: int, quick: bool) -> dict[str, Any]:
    """Rows gathered vs a dense all-reduce of a 32k-row embedding's gradient, mirrored x2.

    Returns:
        ``bytes_per_update`` (each side, summed over the replicas), ``bytes_ratio`` (rows /
        dense) and its goal, ``max_weight_difference`` after the same fits, the sides'
        examples/s and their ``speed_ratio`` (rows / dense), the raw samples and the config.
    """
    strategy = common.strategy("mirrored")
    steps = 8 if quick else 64
    dataset = data(steps)
    distributed = iter(strategy.experimental_distribute_dataset(dataset))
    sent = exchanged_bytes(strategy, next(distributed))
    trainers = side_trainers(strategy)
    sides = {
        name: fits.trainer_side(trainer, dataset, global_batch_size=GLOBAL_BATCH, steps=steps)
        for name, trainer in trainers.items()
    }
    samples = timing.alternate(sides, repeats)
    rates = {name: samples.median(name) for name in sides}
    weights = [t.model.get_weights() for t in trainers.values()]
    return {
        "bytes_per_update": sent,
        "bytes_ratio": timing.ratio(sent["rows"], sent["dense"]),
        "goals": {"bytes_ratio": "<= 0.10"},
        "words": {
            "bytes_ratio": "embedding gradient as rows / dense, bytes sent",
            "speed_ratio": "rows / dense exchange, examples/s",
        },
        "max_weight_difference": max(float(np.max(np.abs(a - b))) for a, b in zip(*weights)),
        "rows_examples_per_s": rates["rows"],
        "dense_examples_per_s": rates["dense"],
        "speed_ratio": timing.ratio(rates["rows"], rates["dense"]),
        "others_cpu_max": samples.max_others_cpu(),
        "samples": samples.as_dict(),
        "config": {
            "strategy": "mirrored",
            "replicas": strategy.num_replicas_in_sync,
            "embedding_rows": ROWS,
            "embedding_width": WIDTH,
            "sequence": SEQUENCE,
            "global_batch_size": GLOBAL_BATCH,
            "rows_touched_at_most": int(ROWS * TOUCHED),
            "steps_per_fit": steps,
            "optimizer": "SGD(0.5)",
        },
    }
