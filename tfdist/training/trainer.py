"""``Trainer``: the one fit/evaluate loop for every strategy.

The loop decides *when* things happen (epochs, executions, callbacks,
validation); the runner from ``tfdist.strategies`` decides *how* a step runs on
its strategy; ``training/step.py`` decides *what* a step does.

This module only checks the Trainer's arguments and wires the parts, one job
each: ``options`` (option groups), ``build`` (model, optimizer and metrics into
the scope), ``functions`` (the compiled functions), ``sources`` (data
arguments), ``loop`` (the epoch loop), ``evaluation`` (evaluate, predict) and
``resume`` (backups and resuming).

Example (``python -c`` or a script)::

    import tfdist
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    trainer = tfdist.Trainer(lambda: tfdist.models.get("cnn"), strategy=strategy,
                             loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                             metrics=["accuracy"])
    history = trainer.fit(tfdist.data.load("digits"), epochs=5, global_batch_size=128,
                          validation_data=tfdist.data.load("digits", split="validation"))
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import keras
import tensorflow as tf

from tfdist import _compat
from tfdist.config import check_positive_int, invalid_argument
from tfdist.data.inputs import InputSource, as_input, check_evaluation_steps
from tfdist.strategies.base import Runner
from tfdist.strategies.factory import runner_for
from tfdist.training import evaluation, schedules
from tfdist.training import precision as precision_lib
from tfdist.training.build import check_loss, compile_in_scope
from tfdist.training.functions import StepFunctions
from tfdist.training.loop import EpochPlan, check_fit_arguments, fit_epochs, steps_per_execution_for
from tfdist.training.options import (
    BackupOptions,
    ExchangeOptions,
    LRScaling,
    ScalingRule,
    trainer_options,
)
from tfdist.training.placement import ModelOrBuilder
from tfdist.training.resume import FitBackups
from tfdist.training.sources import fit_sources, predict_source

logger = logging.getLogger(__name__)


class Trainer:
    """Trains a Keras model on any tfdist strategy with one loop.

    Args:
        model: A ``keras.Model``, or a zero-arg callable that builds one (it is
            then built inside the strategy scope and under ``precision``). An
            unbuilt model (subclassed ones included) is built inside the scope;
            a model built outside it is rebuilt there from its config, weights
            included (a subclassed model then needs its own ``get_config``).
        strategy: A ``tf.distribute.Strategy`` (see ``tfdist.make_strategy``);
            default the current strategy.
        optimizer: Name or Keras optimizer, created outside the scope or not.
        loss: As for ``keras.Model.compile``.
        metrics: As for ``keras.Model.compile``; aggregated over all replicas.
        precision: ``float32``, ``mixed_float16`` (with dynamic loss scaling),
            ``mixed_bfloat16``, or ``auto``: the fastest exact-enough policy
            for the device (bfloat16 on GPUs with compute capability >= 8.0 and
            CPUs with avx512_bf16/amx_bf16, float16 on GPUs >= 7.0, else
            float32). A mixed policy the device does not run natively (so
            slower than float32) logs one warning on the chief.
            ``trainer.precision`` holds the policy in use.
        accumulation_steps: ``k`` micro-batches per optimizer update. Gradients
            are summed locally and all-reduced once per update; the effective
            batch is ``k * global_batch_size``. ``steps_per_epoch`` still
            counts micro-batches; when it is not a multiple of ``k``, the
            epoch's last few micro-batches make one smaller update that is
            still normalised by its own examples. ``optimizer.iterations``,
            learning-rate schedules and logs' ``updates`` count updates. An
            optimizer's Keras ``gradient_accumulation_steps`` (which fails
            under tf.distribute) is taken over as ``accumulation_steps``.
        steps_per_execution: Batches run per ``tf.function`` call (rounded
            down to whole updates, at least one). Callbacks' batch hooks run
            once per call, with the logs of its last batch, as in Keras.
            ``"auto"`` (default): one update per call when a callback has
            train-batch hooks (so they see every update), else the runner's
            choice (``SyncRunner.auto_steps_per_execution``, 32 batches: the
            per-call costs, i.e. fetching the logs, reducing the metrics
            across workers and the preemption vote, are paid once per 32
            batches instead of every batch), ending calls at backup ``freq``
            boundaries. ``trainer.steps_per_execution`` holds the value in use
            once ``fit`` started.
        backup: Fault tolerance: a :class:`~tfdist.training.options.BackupOptions`
            (``dir``, ``freq``, ``keep_last``, ``keep_after_success``). A
            restarted ``fit`` resumes at the exact update of the last backup;
            on SIGTERM the run saves at the next step boundary and exits with
            code 75, which ``tfdist launch`` restarts. Without a backup,
            SIGTERM stops every worker at the same step boundary (exit code 143).
        lr_scaling: A :class:`~tfdist.training.options.LRScaling` (rule,
            ``base_global_batch_size``, ``warmup_steps`` or ``warmup_epochs``),
            or its rule alone: ``"linear"`` multiplies the learning rate by
            ``k * global_batch_size / base_global_batch_size`` (Goyal et al.);
            ``"none"`` (default) leaves it.
        exchange: How the gradients are all-reduced, an
            :class:`~tfdist.training.options.ExchangeOptions` (16-bit
            ``compression``, ``bucket_bytes``); default one float32 all-reduce.
        backup_dir, backup_freq, keep_backups, keep_backup: Shortcuts for
            ``backup=BackupOptions(dir, freq=, keep_last=, keep_after_success=)``;
            without ``backup_dir`` the others are checked but unused.
        base_global_batch_size, warmup_steps, warmup_epochs: Shortcuts for the
            fields of ``LRScaling`` when ``lr_scaling`` is a rule name.
        gradient_compression, bucket_bytes: Shortcuts for
            ``exchange=ExchangeOptions(compression=, bucket_bytes=)``.

    A shortcut next to its option object is an error (each setting has one
    place). With ``mixed_float16``, losses are scaled before the backward pass
    and the summed gradients unscaled once per update; an update whose
    gradients are not finite is skipped (the loss scale halves) and counted in
    the logs as ``skipped_updates``, next to ``loss_scale``. With scaling or
    warmup the logs carry ``learning_rate``.

    Raises:
        ValueError: For an unknown precision or loss name, a non-positive step
            count, a backup ``dir`` that is a file, a shortcut given with its
            option object, or a model that cannot be placed in the strategy scope.
    """

    def __init__(
        self,
        model: ModelOrBuilder,
        *,
        strategy: tf.distribute.Strategy | None = None,
        optimizer: Any = "adam",
        loss: Any = None,
        metrics: Sequence[Any] | None = None,
        precision: precision_lib.Precision = "float32",
        accumulation_steps: int = 1,
        steps_per_execution: int | Literal["auto"] = "auto",
        backup: BackupOptions | None = None,
        lr_scaling: LRScaling | ScalingRule = "none",
        exchange: ExchangeOptions | None = None,
        backup_dir: str | None = None,
        backup_freq: int | str | None = None,
        keep_backup: bool | None = None,
        keep_backups: int | None = None,
        base_global_batch_size: int | None = None,
        warmup_steps: int | None = None,
        warmup_epochs: float | None = None,
        gradient_compression: str | None = None,
        bucket_bytes: int | None = None,
    ) -> None:
        # Every argument is checked here, once, before anything is built.
        precision_lib.check_precision(precision)
        check_positive_int("accumulation_steps", accumulation_steps)
        if steps_per_execution != "auto" and (
            isinstance(steps_per_execution, bool)
            or not isinstance(steps_per_execution, int)
            or steps_per_execution < 1
        ):
            raise invalid_argument(
                "steps_per_execution", steps_per_execution, "a positive integer or 'auto'"
            )
        check_loss(loss)
        # The option groups, each from its object or its shortcuts, checked once (backup: None
        # without a directory).
        self.backup, self.lr_scaling, self.exchange = trainer_options(
            backup=backup,
            lr_scaling=lr_scaling,
            exchange=exchange,
            backup_dir=backup_dir,
            backup_freq=backup_freq,
            keep_backup=keep_backup,
            keep_backups=keep_backups,
            base_global_batch_size=base_global_batch_size,
            warmup_steps=warmup_steps,
            warmup_epochs=warmup_epochs,
            gradient_compression=gradient_compression,
            bucket_bytes=bucket_bytes,
        )
        self.strategy = strategy or tf.distribute.get_strategy()
        self._runner = runner_for(self.strategy)
        if precision == "auto" and isinstance(model, keras.Model):
            precision = model.dtype_policy.name  # a model already made keeps its policy
        # "auto" becomes a concrete policy; a policy the device runs slowly warns once (chief).
        self.precision = precision_lib.resolve_precision(precision, is_chief=self._runner.is_chief)
        self._steps_per_execution = steps_per_execution  # as given: "auto" is resolved by each fit
        self.steps_per_execution = steps_per_execution
        _compat.apply()
        compiled = compile_in_scope(
            model,
            strategy=self.strategy,
            precision=self.precision,
            optimizer=optimizer,
            loss=loss,
            metrics=metrics,
            accumulation_steps=accumulation_steps,
            lr_scaling=self.lr_scaling,
        )
        self.model = compiled.model
        self.accumulation_steps = compiled.accumulation_steps
        self._functions = StepFunctions(
            self.model,
            self._runner,
            accumulation_steps=self.accumulation_steps,
            exchange=self.exchange,
            schedule=compiled.schedule,
            skipped_updates=compiled.skipped_updates,
        )
        self._backups = FitBackups(
            self.backup,
            model=self.model,
            runner=self._runner,
            skipped_updates=compiled.skipped_updates,
        )

    # -- public state -------------------------------------------------------
    @property
    def is_chief(self) -> bool:
        """Whether this process is the one that writes logs and checkpoints."""
        return self._runner.is_chief

    @property
    def runner(self) -> Runner:
        """How steps run on this strategy (a ``tfdist.strategies.base.Runner``)."""
        return self._runner

    @property
    def learning_rate_schedule(self) -> schedules.ScaledWarmup | None:
        """The schedule wrapping the optimizer's learning rate with scaling or warmup, else None."""
        return self._functions.schedule

    @property
    def train_functions(self) -> Mapping[tuple[int, int], Any]:
        """The compiled train functions, by ``(global_batch_size, micro-batches per update)``.

        Read-only; for inspecting what was traced (e.g. the collectives in a
        graph). A fit whose epochs end in a partial update adds a second key.
        """
        return self._functions.train_functions

    # -- helpers ------------------------------------------------------------
    def _auto_steps_per_execution(self) -> int:
        return int(self._runner.auto_steps_per_execution)

    def _evaluate_source(self, source: InputSource, steps: int | None) -> dict[str, float]:
        per_call = (
            self.steps_per_execution
            if self.steps_per_execution != "auto"
            else self._auto_steps_per_execution()
        )
        return evaluation.evaluate(self._functions, source, steps, steps_per_execution=per_call)

    # -- public loop --------------------------------------------------------
    def fit(
        self,
        data: Any,
        *,
        epochs: int = 1,
        steps_per_epoch: int | None = None,
        global_batch_size: int | None = None,
        validation_data: Any = None,
        validation_steps: int | None = None,
        callbacks: Sequence[keras.callbacks.Callback] = (),
        verbose: str | int = "auto",
        initial_epoch: int = 0,
    ) -> keras.callbacks.History:
        """Trains for ``epochs`` epochs and returns the Keras ``History``.

        Args:
            data: A ``tfdist.data.DatasetFn``, a ``dataset_fn(input_context)``,
                a ``tf.data.Dataset`` of global batches, or ``(x, y)`` arrays.
            epochs: Epochs to train (``initial_epoch`` counts toward them).
            steps_per_epoch: Batches per epoch. Default one pass over ``data``;
                when given, one iterator runs on across epochs over the data
                repeated, so it may exceed one pass.
            global_batch_size: Examples per batch across all replicas.
                Default: bound in a ``DatasetFn``, the first batch's size for a
                dataset (per-replica batch times replicas for a dataset_fn), or
                32 for arrays.
            validation_data: Evaluated at each epoch end; its metrics appear
                in the logs with a ``val_`` prefix.
            validation_steps: Batches of ``validation_data`` per evaluation.
            callbacks: Keras callbacks. On non-chief workers their outputs go
                to a temporary directory.
            verbose: ``"auto"``/1 progress bar, 2 one line per epoch, 0 silent.
                Only the chief prints.
            initial_epoch: Epoch to start from.

        Returns:
            A ``keras.callbacks.History`` with the keys ``model.fit`` gives.
        """
        callbacks = check_fit_arguments(
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            validation_steps=validation_steps,
            initial_epoch=initial_epoch,
            verbose=verbose,
            callbacks=callbacks,
            requires_steps_per_epoch=self._runner.requires_steps_per_epoch,
        )
        source, steps, val_source = fit_sources(
            data,
            validation_data,
            runner=self._runner,
            model=self.model,
            global_batch_size=global_batch_size,
            steps_per_epoch=steps_per_epoch,
            validation_steps=validation_steps,
        )
        k = self.accumulation_steps
        full_updates, last_window = divmod(steps, k)
        functions = self._functions
        if functions.schedule is not None:
            # Before the first trace: the compiled step reads the schedule's numbers as constants.
            schedules.resolve(
                functions.schedule,
                self.lr_scaling,
                effective_global_batch_size=source.global_batch_size * k,
                updates_per_epoch=full_updates + bool(last_window),
            )
        functions.build(source)
        gbs = source.global_batch_size

        def start(micro_batches: int, iterator: Any, num_updates: int) -> Any:
            return functions.start(functions.train(gbs, micro_batches), iterator, num_updates)

        functions.train(gbs, k)  # traced lazily, but made now so that train_functions lists it
        self.steps_per_execution = steps_per_execution_for(
            self._steps_per_execution, callbacks, auto=self._auto_steps_per_execution()
        )
        self.model.stop_training = False
        backup = self._backups.open()
        position = self._backups.restore(backup)  # every worker: the chief's position
        plan = EpochPlan(
            steps, k, self.steps_per_execution, self.backup.freq if self.backup else "epoch"
        )
        validate = None
        if val_source is not None:

            def validate() -> dict[str, float]:
                return self._evaluate_source(val_source, validation_steps)

        # The loop sees only `start` and `functions.logs`, never this Trainer.
        fit_epochs(
            plan,
            runner=self._runner,
            model=self.model,
            callbacks=callbacks,
            verbose=1 if verbose == "auto" else int(verbose),
            start=start,
            logs_fn=functions.logs,
            backup=backup,
            position=position,
            source=source,
            epochs=epochs,
            initial_epoch=initial_epoch,
            repeat=bool(steps_per_epoch),
            validate=validate,
        )
        self._backups.finish(backup)
        return self.model.history

    def evaluate(
        self, data: Any, *, steps: int | None = None, global_batch_size: int | None = None
    ) -> dict[str, float]:
        """Evaluates the model; each example counts once, on every strategy.

        Args:
            data: As for :meth:`fit`.
            steps: Batches to evaluate; default one pass.
            global_batch_size: Examples per batch across all replicas. Default
                as for :meth:`fit`; an unbound ``DatasetFn`` takes the one of
                this Trainer's first ``fit`` or ``evaluate``.

        Returns:
            A dict of metric name to value, e.g. ``{"loss": ..., "accuracy": ...}``.
        """
        check_positive_int("steps", steps, allow_none=True)
        source = as_input(
            data,
            input_context=self._runner.input_context(),
            global_batch_size=global_batch_size,
            training=False,
            argument="data",
            fallback_global_batch_size=self._functions.built_for,
        )
        check_evaluation_steps("steps", steps, source)
        return self._evaluate_source(source, steps)

    def predict(
        self, data: Any, *, steps: int | None = None, global_batch_size: int | None = None
    ) -> Any:
        """Runs the model on ``data``, distributed like :meth:`evaluate`; outputs in input order.

        Args:
            data: Inputs ``x`` as an array (or dict of arrays), an
                ``(x, y[, sample_weight])`` tuple (``y`` is ignored), or any
                form :meth:`fit` takes. Each step's outputs are concatenated
                in replica order: input order with one input pipeline
                (one_device, mirrored; parameter_server predicts on the
                coordinator). With several workers that holds when each
                global batch is split over the replicas in order; a
                dataset_fn that shards by worker gives its own order.
            steps: Batches to predict; default all of ``data``.
            global_batch_size: Examples per batch across all replicas (default
                32 for arrays).

        Returns:
            The outputs as NumPy arrays (a structure of them for a
            multi-output model), one row per input example; a partial last
            batch included.
        """
        check_positive_int("steps", steps, allow_none=True)
        source, shown = predict_source(
            data, runner=self._runner, model=self.model, global_batch_size=global_batch_size
        )
        return evaluation.predict(self._functions, source, steps, shown=shown)
