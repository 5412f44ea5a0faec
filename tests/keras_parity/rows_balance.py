"""Parity rows for balanced batches (``Trainer(balance=)``, multi_worker only): weighted and
masked losses on an uneven split, each exact against Keras's ``fit`` on one device.

A balanced run gives each worker its own slice of every global batch, so the workers' example
counts, valid counts (masks, ``ignore_class``) and sums of weights all differ. The Trainer
divides each term by the count of the whole global batch, so any split gives Keras's update.
The splits are forced (``BalanceOptions(splits=)``), one update per call, and change at
updates 1 and 3 (the accumulating row makes 4 updates in all, the others 8 or 12).
"""

import dataclasses

from tests.keras_parity import rows_fit_arguments, rows_masks
from tfdist import BalanceOptions

#: Forced splits of each global batch of 16 (and of each micro-batch of 16 with accumulation):
#: (update, (worker 0's examples, worker 1's)). tests/keras_parity/test_parity_multi_worker.py
#: checks that the chief logged each of them.
SPLITS = ((0, (5, 11)), (1, (13, 3)), (3, (1, 15)))
#: The rows trained again on the forced splits, as ``balance_<name>``.
BASES = (
    "masks_embedding_mask_zero",
    "masks_two_outputs_accumulation",
    "masks_zero_sample_weights",
    "arrays_class_weight",
)


def balanced(row):
    """``row`` on multi_worker with the forced splits, one update per call."""
    trainer = {**row.trainer, "balance": BalanceOptions(splits=SPLITS), "steps_per_execution": 1}
    return dataclasses.replace(
        row, name=f"balance_{row.name}", trainer=trainer, strategies=("multi_worker",)
    )


_BY_NAME = {r.name: r for r in rows_masks.ROWS + rows_fit_arguments.ROWS}
ROWS = [balanced(_BY_NAME[name]) for name in BASES]
