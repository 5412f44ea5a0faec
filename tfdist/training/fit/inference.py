"""``Trainer.evaluate`` and ``Trainer.predict``, with Keras's arguments, on every strategy.

A mixin of `tfdist.training.trainer.Trainer`: it reads the Trainer's
runner, compiled functions, model and ``steps_per_execution``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

from tfdist._compat.keras_internals.keras_training import metrics_in_order
from tfdist.config import check_positive_int, invalid_argument
from tfdist.training.fit import evaluation
from tfdist.training.fit.arguments import (
    check_batch_size,
    check_callbacks,
    check_verbose,
    steps_per_execution_for,
)
from tfdist.training.fit.keras_data import keras_data
from tfdist.training.fit.sources import evaluate_source, predict_source


class EvaluateAndPredict:
    """Keras's ``evaluate`` and ``predict`` for the Trainer (see the Trainer's attributes)."""

    def evaluate(
        self,
        x: Any = None,
        y: Any = None,
        batch_size: int | None = None,
        verbose: str | int = "auto",
        sample_weight: Any = None,
        steps: int | None = None,
        callbacks: Sequence[keras.callbacks.Callback] | None = None,
        return_dict: bool = False,
        *,
        global_batch_size: int | None = None,
    ) -> Any:
        """Evaluates as ``keras.Model.evaluate``; each example counts once, on every strategy.

        Args:
            x, y, sample_weight: As for `fit`.
            batch_size: Examples per step across all replicas (alias
                ``global_batch_size``); any size for arrays and a ``tf.data.Dataset``
                (a batch that does not divide by the replicas is split into shares
                of ``ceil``/``floor`` its size over them, as Keras takes any batch), a
                multiple of the replicas for a dataset_fn or ``DatasetFn`` (they batch
                per replica). Default as for `fit`; an unbound ``DatasetFn``
                takes the one of this Trainer's first ``fit`` or ``evaluate``.
            verbose: ``"auto"``/1 progress bar, 2 one line, 0 silent (chief only).
            steps: Batches to evaluate; default one pass.
            callbacks: Keras callbacks; their test hooks run as under
                ``model.evaluate`` (batch hooks once per call of
                ``steps_per_execution`` batches, as Keras).
            return_dict: As Keras: a dict of metric name to value if True, else
                the loss alone, or a list in ``model.metrics_names`` order.
            global_batch_size: tfdist's name for ``batch_size``.

        Returns:
            The loss and metrics, shaped as ``return_dict`` says.
        """
        gbs = check_batch_size(batch_size, global_batch_size)
        verbose = check_verbose(verbose)
        hooks = self._callback_list(callbacks)
        if not isinstance(return_dict, bool):
            raise invalid_argument("return_dict", return_dict, "True or False")
        source = evaluate_source(
            keras_data(x, y, sample_weight),
            runner=self._runner,
            steps=steps,
            global_batch_size=gbs,
            fallback_global_batch_size=self._functions.built_for,
        )
        # After a fit, the value it used; before any, what "auto" picks without callbacks.
        per_call = steps_per_execution_for(self.steps_per_execution, (), runner=self._runner)
        logs = evaluation.evaluate(
            self._functions,
            source,
            steps,
            steps_per_execution=per_call,
            verbose=verbose,
            callbacks=hooks,
        )
        return logs if return_dict else metrics_in_order(self.model, logs)

    def predict(
        self,
        x: Any,
        batch_size: int | None = None,
        verbose: str | int = "auto",
        steps: int | None = None,
        callbacks: Sequence[keras.callbacks.Callback] | None = None,
        *,
        global_batch_size: int | None = None,
    ) -> Any:
        """Runs the model on ``x``, distributed like `evaluate`; outputs in input order.

        Args:
            x: Inputs as an array (or dict/list of arrays), an
                ``(x, y[, sample_weight])`` tuple (``y`` is ignored; single-input
                models), or any form `fit` takes.
            batch_size: Examples per batch across all replicas (default 32
                for arrays; alias ``global_batch_size``): any size for arrays and a
                ``tf.data.Dataset`` (split unevenly over the replicas, outputs still
                in input order), as in Keras.
            verbose: ``"auto"``/1 progress bar, 2 one line, 0 silent (chief only).
            steps: Batches to predict; default all of ``x``.
            callbacks: Keras callbacks; their predict hooks run once per batch.
            global_batch_size: tfdist's name for ``batch_size``.

        Returns:
            The outputs as NumPy arrays (a structure of them for a
            multi-output model), one row per input example, in the order
            `tfdist.training.fit.evaluation.predict` describes.
        """
        gbs = check_batch_size(batch_size, global_batch_size)
        verbose = check_verbose(verbose)
        hooks = self._callback_list(callbacks)
        check_positive_int("steps", steps, allow_none=True)
        source, shown = predict_source(
            x, runner=self._runner, model=self.model, global_batch_size=gbs
        )
        return evaluation.predict(
            self._functions, source, steps, shown=shown, verbose=verbose, callbacks=hooks
        )

    def _callback_list(self, callbacks: Any) -> keras.callbacks.CallbackList:
        """The user's callbacks for one ``evaluate``/``predict`` (no history, no progress bar)."""
        return keras.callbacks.CallbackList(
            list(check_callbacks(callbacks)), add_history=False, add_progbar=False, model=self.model
        )
