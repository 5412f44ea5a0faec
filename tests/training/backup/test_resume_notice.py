"""A resumed run says so on the chief, for the Trainer and for the BackupAndRestore callback."""

import logging

import keras

import tfdist
from tests.jobs.common import builder, dataset, initial_weights

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def test_trainer_says_where_it_resumed(tmp_path, caplog):
    strategy = tfdist.make_strategy("mirrored", num_devices=2)

    def trainer():
        return tfdist.Trainer(
            builder(initial_weights()),
            strategy=strategy,
            optimizer="sgd",
            loss=LOSS,
            backup_dir=str(tmp_path),
            keep_backup=True,
        )

    trainer().fit(dataset(), epochs=1, verbose=0)  # 6 updates, backup at the end of epoch 1
    with caplog.at_level(logging.WARNING, logger="tfdist.training.trainer"):
        trainer().fit(dataset(), epochs=2, verbose=0)
    assert "Resumed from update 6 (epoch 2, step 0)" in caplog.text


def test_callback_says_where_it_resumed(tmp_path, caplog):
    def fit(epochs):
        model = builder(initial_weights())()
        model.compile("sgd", LOSS)
        model.fit(
            dataset(),
            epochs=epochs,
            verbose=0,
            callbacks=[tfdist.callbacks.BackupAndRestore(str(tmp_path), keep_backup=True)],
        )

    fit(1)
    with caplog.at_level(logging.WARNING, logger="tfdist.training.fit.chief_only"):
        fit(2)
    assert "Resumed from update 6 (epoch 2, step 0)" in caplog.text
