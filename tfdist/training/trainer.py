"""``Trainer``: the one fit/evaluate loop for every strategy.

The loop decides *when* things happen (epochs, executions, callbacks,
validation); the runner from ``tfdist.strategies`` decides *how* a step runs on
its strategy; ``training/step/update.py`` decides *what* a step does. This module only
checks the Trainer's arguments and wires the parts (one job per module, listed
in `tfdist.training`).

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

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import keras
import tensorflow as tf

from tfdist import _compat
from tfdist.config import check_positive_int, check_steps_per_execution
from tfdist.strategies.base import Runner
from tfdist.strategies.factory import runner_for
from tfdist.training.backup.fit_backups import FitBackups
from tfdist.training.balance.balancer import BalanceOptions, balance_options, enable_balance
from tfdist.training.build import lr_schedules as schedules
from tfdist.training.build import precision as precision_lib
from tfdist.training.build.placement import ModelOrBuilder
from tfdist.training.build.scope import check_loss, compile_in_scope, model_precision
from tfdist.training.fit.arguments import FitArguments, check_fit_arguments, steps_per_execution_for
from tfdist.training.fit.callback_mapping import resolve_callbacks
from tfdist.training.fit.inference import EvaluateAndPredict
from tfdist.training.fit.keras_data import keras_data
from tfdist.training.fit.run import run_fit
from tfdist.training.functions import StepFunctions
from tfdist.training.health.monitor import check_health_options
from tfdist.training.health.stragglers import DEFAULT_STRAGGLERS, StragglerOptions
from tfdist.training.health.watchdog import DEFAULT_WATCHDOG, WatchdogOptions
from tfdist.training.local_sgd.options import LocalSGDOptions, check_local_sgd, local_sgd_options
from tfdist.training.options import (
    SHORTCUT_KEYWORDS,
    BackupOptions,
    ExchangeOptions,
    LRScaling,
    OptionAttribute,
    ScalingRule,
    TrainerOptions,
    trainer_options,
)
from tfdist.training.pipeline.checks import check_pipeline_model, check_pipeline_options
from tfdist.training.pipeline.options import PipelineOptions
from tfdist.training.pipeline.update import Pipeline
from tfdist.training.step.model_steps import check_custom_train_step
from tfdist.training.zero.parameters import check_trainer as check_parameters
from tfdist.training.zero.state import check_optimizer, check_sharding


class Trainer(EvaluateAndPredict):
    """Trains a Keras model on any tfdist strategy with one loop.

    Its seven option groups are small checked objects: ``backup``, ``lr_scaling`` and
    ``exchange`` (`tfdist.training.options`, each with flat shortcut keywords: a shortcut next
    to its option object is an error, one place per setting), ``watchdog`` (`tfdist.config`),
    ``stragglers`` (`tfdist.training.health.stragglers`), ``pipeline``
    (`tfdist.training.pipeline.options`) and ``balance`` (`tfdist.training.balance.balancer`).
    The Trainer checks them once and holds them, with its precision, accumulation steps and
    steps per execution, in one frozen `tfdist.training.options.TrainerOptions`,
    ``trainer.options``, which ``trainer.backup``, ``trainer.exchange``, ... read.

    Args:
        model: A ``keras.Model``, or a zero-arg callable that builds one in the
            strategy scope under ``precision``. A model made outside the scope
            (built, adapted or compiled) is moved into it as the same object,
            so ``trainer.model is model`` and your object holds the trained
            weights (see `tfdist.training.build.placement`).
        strategy: A ``tf.distribute.Strategy`` (see ``tfdist.make_strategy``);
            default the current strategy.
        optimizer: Name or Keras optimizer, created outside the scope or not;
            default ``"adam"``, or the optimizer of a model already compiled.
        loss: As for ``keras.Model.compile``. A model already compiled brings its
            own ``optimizer``, ``loss``, ``loss_weights`` and ``metrics`` (see
            `tfdist.training.build.compiled`); giving them here too is an error.
        metrics: As for ``keras.Model.compile`` (a list, or a dict per output);
            aggregated over all replicas. Metric objects are copied into the
            scope with every attribute (your objects are left as they were).
        loss_weights: As for ``keras.Model.compile``: a weight per output's loss.
        weighted_metrics: As for ``keras.Model.compile``: metrics that take sample weights.
        precision: ``float32``, ``mixed_float16``, ``mixed_bfloat16`` or
            ``auto`` (see `tfdist.training.build.precision`); the policy in use
            is ``trainer.precision``.
        accumulation_steps: ``k`` micro-batches per optimizer update, one
            all-reduce each (see `tfdist.training.step.update`).
        steps_per_execution: Batches per ``tf.function`` call, or ``"auto"``
            (see `steps_per_execution_for`);
            the value in use is ``trainer.steps_per_execution``.
        backup: Step-exact backups and SIGTERM handling, a ``BackupOptions``.
        lr_scaling: Learning-rate scaling and warmup, an ``LRScaling`` or its
            rule alone (``"linear"``, or ``"none"``: the default).
        exchange: How gradients are all-reduced, an ``ExchangeOptions``.
        watchdog: The progress watchdog of every task, a ``WatchdogOptions``
            (see `tfdist.training.health.watchdog`); None turns it off.
        stragglers: The straggler report of multi-worker runs, a
            ``StragglerOptions`` (see `tfdist.training.health.stragglers`); None turns it
            off. On by default: its timestamps cost nothing measurable (docs/scaling.md,
            "Health overhead").
        backup_dir: Shortcut for ``BackupOptions.dir``.
        backup_freq: Shortcut for ``BackupOptions.freq``.
        keep_backup: Shortcut for ``BackupOptions.keep_after_success``.
        keep_backups: Shortcut for ``BackupOptions.keep_last``.
        base_global_batch_size: Shortcut for ``LRScaling.base_global_batch_size``.
        warmup_steps: Shortcut for ``LRScaling.warmup_steps``.
        warmup_epochs: Shortcut for ``LRScaling.warmup_epochs``.
        gradient_compression: Shortcut for ``ExchangeOptions.compression``.
        bucket_bytes: Shortcut for ``ExchangeOptions.bucket_bytes``.
        sharding: Shortcut for ``ExchangeOptions.sharding``: ``"optimizer"``,
            ``"gradients"`` or ``"parameters"`` shards the optimizer state (and the gradients,
            and the weights) over the replicas, ZeRO-1/2/3 (mirrored and multi_worker).
        keep_whole_below: Shortcut for ``ExchangeOptions.keep_whole_below``: with
            ``sharding="parameters"``, trainable variables of fewer elements stay whole.
        units: Shortcut for ``ExchangeOptions.units``: with ``sharding="parameters"``, the
            layer classes and names gathered one call at a time (a subclassed transformer's
            blocks), anywhere in the model.
        pipeline: Model parallelism: the model cut into stages on devices, trained with the
            GPipe schedule, a ``PipelineOptions`` (see `tfdist.training.pipeline.options`); under
            the default strategy, or ``multi_worker`` made with ``stage_devices=K`` (the hybrid).
        balance: ``True`` or a ``BalanceOptions``: on ``multi_worker``, each worker's share of
            every global batch follows its measured speed (see `tfdist.training.balance.balancer`).
        local_sgd: A ``LocalSGDOptions``: each replica takes its own updates and the replicas
            average their parameters every ``sync_every`` updates, or apply the averaged change
            with an outer optimizer (DiLoCo); see `tfdist.training.local_sgd`.

    Raises:
        ValueError: For a bad argument, option or shortcut, or a model that
            cannot be placed in the strategy scope.
    """

    # Each option is held once, in ``self.options``; these attributes read it.
    precision = OptionAttribute()
    accumulation_steps = OptionAttribute()
    backup = OptionAttribute()
    lr_scaling = OptionAttribute()
    exchange = OptionAttribute()
    watchdog = OptionAttribute()
    stragglers = OptionAttribute()
    pipeline = OptionAttribute()
    balance = OptionAttribute()
    local_sgd = OptionAttribute()

    def __init__(
        self,
        model: ModelOrBuilder,
        *,
        strategy: tf.distribute.Strategy | None = None,
        optimizer: Any = None,
        loss: Any = None,
        metrics: Any = None,
        loss_weights: Any = None,
        weighted_metrics: Any = None,
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
        sharding: str | None = None,
        keep_whole_below: int | None = None,
        units: tuple | None = None,
        watchdog: WatchdogOptions | None = DEFAULT_WATCHDOG,
        stragglers: StragglerOptions | None = DEFAULT_STRAGGLERS,
        pipeline: PipelineOptions | None = None,
        balance: bool | BalanceOptions = False,
        local_sgd: LocalSGDOptions | None = None,
    ) -> None:
        precision_lib.check_precision(precision)  # every argument checked here, before a build
        check_positive_int("accumulation_steps", accumulation_steps)
        check_loss(loss)
        shortcuts = {name: value for name, value in locals().items() if name in SHORTCUT_KEYWORDS}
        backup, lr_scaling, exchange = trainer_options(
            backup=backup, lr_scaling=lr_scaling, exchange=exchange, **shortcuts
        )  # the option groups, from objects or shortcuts (backup: None without a directory)
        watchdog, stragglers = check_health_options(watchdog, stragglers, backup)
        self.strategy = strategy or tf.distribute.get_strategy()
        self._runner = runner_for(self.strategy)
        options = TrainerOptions(
            precision=model_precision(precision, model, is_chief=self._runner.is_chief),
            accumulation_steps=accumulation_steps,
            steps_per_execution=steps_per_execution,
            backup=backup,
            lr_scaling=lr_scaling,
            exchange=exchange,
            watchdog=watchdog,
            stragglers=stragglers,
            pipeline=check_pipeline_options(pipeline, self._runner, exchange.sharding),
            balance=balance_options(balance),
            local_sgd=local_sgd_options(local_sgd),
        )
        compile_arguments = dict(optimizer=optimizer, loss=loss, metrics=metrics)
        compile_arguments.update(loss_weights=loss_weights, weighted_metrics=weighted_metrics)
        self._compile(model, compile_arguments, options)

    def _compile(
        self, model: ModelOrBuilder, compile_arguments: dict[str, Any], options: TrainerOptions
    ) -> None:
        """The model compiled in the strategy's scope, its step functions and its backups;
        ``self.options``: ``options`` with what compiling decided."""
        check_steps_per_execution(options.steps_per_execution)  # the last checks, before any build
        check_sharding(options.exchange.sharding, self._runner)
        _compat.apply()
        compiled = compile_in_scope(
            model,
            compile_arguments,
            strategy=self.strategy,
            precision=options.precision,
            accumulation_steps=options.accumulation_steps,
            lr_scaling=options.lr_scaling,
        )
        self.model = compiled.model
        check_custom_train_step(
            self.model, accumulation_steps=compiled.accumulation_steps, exchange=options.exchange
        )
        if options.exchange.sharding is not None:
            check_optimizer(self.model.optimizer, options.exchange.sharding)
        if options.exchange.sharding == "parameters" and self.strategy.num_replicas_in_sync > 1:
            check_parameters(pipeline=options.pipeline, balance=options.balance)
        devices = check_pipeline_model(options.pipeline, self.model, self._runner)
        check_local_sgd(options.local_sgd, self._runner, options, self.model)
        steps_per_execution = options.steps_per_execution  # "auto" is resolved by each fit
        if steps_per_execution == "auto" and compiled.steps_per_execution:
            # The model was compiled with steps_per_execution=N: Keras's fit would run N per call.
            steps_per_execution = compiled.steps_per_execution
        self.options = dataclasses.replace(
            options,
            accumulation_steps=compiled.accumulation_steps,
            steps_per_execution=steps_per_execution,
            balance=enable_balance(options.balance, self._runner, self.model, options.pipeline),
        )
        self.steps_per_execution = steps_per_execution
        self._functions = StepFunctions(
            self.model,
            self._runner,
            accumulation_steps=self.accumulation_steps,
            exchange=self.exchange,
            schedule=compiled.schedule,
            skipped_updates=compiled.skipped_updates,
            pipeline=None if devices is None else Pipeline(self.pipeline, devices, self.strategy),
            local_sgd=self.local_sgd,
        )
        self._backups = FitBackups(
            self.backup,
            model=self.model,
            runner=self._runner,
            skipped_updates=compiled.skipped_updates,
            sharded=lambda: self._functions.sharded,
            local_sgd=lambda: self._functions.updates.local,
        )

    @property
    def is_chief(self) -> bool:
        """Whether this process is the one that writes logs and checkpoints."""
        return self._runner.is_chief

    @property
    def replica_bytes(self) -> dict[str, Any] | None:
        """Bytes each replica holds (parameters, optimizer state, gradient buffers, master
        shards), from the variables' shapes, and under ``"unsharded"`` the same without
        sharding; None until the model is built (the first fit)."""
        if self._functions.built_for is None:
            return None
        return self._functions.replica_bytes()

    @property
    def stages(self) -> list[Any] | None:
        """With ``pipeline=``: the stages once the model is built (each ``.model``, a sub-model
        sharing the model's layers, and ``.device``); else None."""
        return None if self._functions.pipeline is None else self._functions.pipeline.stages

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

        Read-only, to inspect what was traced. A partial last update adds a second key.
        """
        return self._functions.train_functions

    def fit(
        self,
        x: Any = None,
        y: Any = None,
        batch_size: int | None = None,
        epochs: int = 1,
        verbose: str | int = "auto",
        callbacks: Sequence[keras.callbacks.Callback] | None = None,
        validation_split: float = 0.0,
        validation_data: Any = None,
        shuffle: bool | str = True,
        class_weight: Mapping[int, float] | None = None,
        sample_weight: Any = None,
        initial_epoch: int = 0,
        steps_per_epoch: int | None = None,
        validation_steps: int | None = None,
        validation_batch_size: int | None = None,
        validation_freq: int | Sequence[int] = 1,
        *,
        global_batch_size: int | None = None,
    ) -> keras.callbacks.History:
        """Trains as ``keras.Model.fit`` does, on this Trainer's strategy; returns the ``History``.

        The arguments are Keras's, in Keras's order, with the same meaning; what
        differs is noted. Anything that cannot apply is one clear error.

        Args:
            x: Arrays (an array, or a dict/list of arrays per input), a
                ``tfdist.data.DatasetFn``, a ``dataset_fn(input_context)``, or a
                ``tf.data.Dataset`` of global ``(x, y[, sample_weight])`` batches.
                ``(x, y[, sample_weight])`` arrays in one tuple are unpacked.
            y: Targets for arrays ``x`` (an array, or a dict/list per output);
                None for the other kinds, which carry their own.
            batch_size: Examples per step across ALL replicas (the global
                batch); ``global_batch_size`` is the same thing. Default: bound
                in a ``DatasetFn``, the first batch's size for a dataset
                (per-replica batch times replicas for a dataset_fn), 32 for arrays.
            epochs: Epochs to train (``initial_epoch`` counts toward them).
            verbose: ``"auto"``/1 progress bar, 2 one line per epoch, 0 silent (chief only).
            callbacks: Keras callbacks, run as by ``model.fit`` (on non-chief
                workers, their files go to a temporary directory and the
                progress bar and ``RemoteMonitor`` do not run). A Keras or
                tfdist ``BackupAndRestore`` becomes this fit's ``BackupOptions``;
                see `tfdist.training.fit.callback_mapping` for the few refused.
            validation_split: Arrays only: the last fraction is held out for
                validation before shuffling, as in Keras. An error next to
                ``validation_data`` (Keras would ignore the split).
            validation_data: ``(x, y[, sample_weight])`` arrays or any ``x``
                form; evaluated after epochs, logged with a ``val_`` prefix.
            shuffle: Arrays: ``True`` reshuffles each epoch (seeded),
                ``False`` keeps their order, ``"batch"`` shuffles inside each
                batch. Ignored with a warning for a dataset or dataset_fn (as
                Keras); a ``DatasetFn`` always shuffles (anything else is an error).
            class_weight: ``{class index: weight}`` turned into sample weights,
                as Keras does, for arrays and datasets alike; single-output
                models without ``sample_weight`` only, keys classes of the model.
            sample_weight: Per-example weights for arrays ``x`` (a dict/list per output).
            initial_epoch: Epoch to start from.
            steps_per_epoch: Batches per epoch; default one pass over ``x``.
                When given, one iterator runs across epochs over the repeated data.
                Required under ``parameter_server``.
            validation_steps: Batches of ``validation_data`` per evaluation.
            validation_batch_size: Global batch of array (or ``DatasetFn``)
                validation data; default the training batch.
            validation_freq: Validate after every Nth epoch, or after the
                (1-based) epochs listed.
            global_batch_size: tfdist's name for ``batch_size`` (both given must agree).

        Returns:
            A ``keras.callbacks.History`` with the keys ``model.fit`` gives.
        """
        given = FitArguments(
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            global_batch_size=global_batch_size,
            validation_steps=validation_steps,
            initial_epoch=initial_epoch,
            verbose=verbose,
            callbacks=callbacks,
            validation_split=validation_split,
            validation_batch_size=validation_batch_size,
            validation_freq=validation_freq,
            shuffle=shuffle,
            class_weight=class_weight,
        )
        runner = self._runner
        sharded = self.exchange.sharding if self.strategy.num_replicas_in_sync > 1 else None
        args = check_fit_arguments(
            given,
            batch_size=batch_size,
            requires_steps_per_epoch=runner.requires_steps_per_epoch,
            sharding=sharded,
        )
        data = keras_data(x, y, sample_weight)
        # Backup callbacks become this fit's BackupOptions; callbacks the Trainer refuses fail here.
        k = self.accumulation_steps
        resolved = resolve_callbacks(
            args.callbacks, backup=self.backup, lr_scaling=self.lr_scaling, accumulation_steps=k
        )
        args = dataclasses.replace(args, callbacks=resolved.callbacks)
        self.steps_per_execution = steps_per_execution_for(
            self.options.steps_per_execution, args.callbacks, runner=runner
        )
        backups = self._backups.for_fit(resolved.backup)
        spe = self.steps_per_execution  # this fit's
        return run_fit(self._functions, backups, data, validation_data, args, self.options, spe)
