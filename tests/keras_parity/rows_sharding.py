"""Parity rows for sharded optimizer state (ZeRO) on two real MultiWorkerMirrored workers.

The mirrored runs of sharding against Keras are in
tests/training/zero/test_sharding_transformers.py;
here the same kind of models run in the shared multi_worker launch: a causal transformer LM whose
``Embedding`` gradient is sparse, trained with Adam under ``sharding="gradients"`` and
accumulation, where each micro-batch's dense gradients are reduce-scattered at once and the
embedding's rows are kept, gathered from both workers at the update (their counts may differ),
and cut into each worker's block of the embedding; and KerasHub's Llama (an untied token
embedding) and BERT (a segment embedding) under each sharding mode.
"""

import dataclasses

from tests.keras_parity.rows_keras_hub import ROWS as KERAS_HUB_ROWS
from tests.keras_parity.rows_keras_hub import classifier_fit
from tests.keras_parity.rows_transformers import ROWS as TRANSFORMER_ROWS
from tests.keras_parity.rows_transformers import lm_fit

_LM_ADAM = next(r for r in TRANSFORMER_ROWS if r.name == "transformers_lm_adam")
_HUB = {r.name: r for r in KERAS_HUB_ROWS}


def _half_batches():
    return dict(classifier_fit(), batch_size=4)


ROWS = [
    dataclasses.replace(
        _LM_ADAM,
        name="sharded_gradients_lm_adam_accumulation",
        fit=lm_fit(batch=8),
        keras_fit=lm_fit(batch=16),
        trainer=dict(sharding="gradients", accumulation_steps=2),
        strategies=("multi_worker",),
        history_keys=("loss", "val_loss"),  # accumulation adds ``updates``
    ),
    dataclasses.replace(
        _HUB["keras_hub_llama_lm_adam"],
        name="sharded_optimizer_keras_hub_llama_lm_adam",
        trainer=dict(sharding="optimizer"),
        strategies=("multi_worker",),
    ),
    dataclasses.replace(
        _HUB["keras_hub_bert_classifier_adam"],
        name="sharded_gradients_keras_hub_bert_classifier_adam_accumulation",
        fit=_half_batches,
        keras_fit=classifier_fit,
        trainer=dict(sharding="gradients", accumulation_steps=2),
        strategies=("multi_worker",),
        history_keys=("loss",),  # accumulation adds ``updates``
    ),
]
