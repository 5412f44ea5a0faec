"""Parity rows for balanced batches (``Trainer(balance=)``, multi_worker only): weighted and
masked losses on an uneven split, each exact against Keras's ``fit`` on one device.

A balanced run gives each worker its own slice of every global batch, so the workers' example
counts, valid counts (masks, ``ignore_class``) and sums of weights all differ. The Trainer
divides each term by the count of the whole global batch, so any split gives Keras's update.
The splits are forced (``BalanceOptions(splits=)``), one update per call, and change at
updates 1 and 3 (the accumulating row makes 4 updates in all, the others 8 or 12).
"""

import keras

from tests.keras_parity.parity import Row
from tests.keras_parity.rows_basic import mlp, sgd_compile
from tests.keras_parity.rows_fit_arguments import fit_with
from tests.keras_parity.rows_masks import (
    cross_entropy,
    dense_model,
    sgd,
    token_fit,
    tokens_model,
    two_outputs_compile,
    two_outputs_dataset,
    zero_weights_fit,
)
from tfdist import BalanceOptions

#: Forced splits of each global batch of 16 (and of each micro-batch of 16 with accumulation):
#: (update, (worker 0's examples, worker 1's)). tests/keras_parity/test_parity_multi_worker.py
#: checks that the chief logged each of them.
SPLITS = ((0, (5, 11)), (1, (13, 3)), (3, (1, 15)))


def balanced(**extra):
    return dict(balance=BalanceOptions(splits=SPLITS), steps_per_execution=1, **extra)


MULTI_WORKER = ("multi_worker",)
ROWS = [
    Row(
        "balance_masks_embedding_mask_zero",
        tokens_model(),
        sgd(cross_entropy(), metrics=["sparse_categorical_accuracy"]),
        token_fit(validation=True),
        trainer=balanced(),
        strategies=MULTI_WORKER,
    ),
    Row(
        "balance_masks_two_outputs_accumulation",
        tokens_model(outputs=2),
        two_outputs_compile,
        two_outputs_dataset(16),
        trainer=balanced(accumulation_steps=2),
        keras_fit=two_outputs_dataset(32),
        history_keys=("loss", "out0_loss", "out1_loss"),
        strategies=MULTI_WORKER,
    ),
    Row(
        "balance_zero_sample_weights",
        dense_model,
        sgd(lambda: keras.losses.MeanSquaredError(reduction="mean_with_sample_weight")),
        zero_weights_fit,
        trainer=balanced(),
        strategies=MULTI_WORKER,
    ),
    Row(
        "balance_class_weight",
        mlp,
        sgd_compile,
        fit_with(class_weight={0: 2.0, 1: 0.5}),
        trainer=balanced(),
        strategies=MULTI_WORKER,
    ),
]
