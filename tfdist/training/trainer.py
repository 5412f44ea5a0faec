"""``Trainer``: the one fit/evaluate loop for every strategy.

The loop decides *when* things happen (epochs, executions, callbacks,
validation); the runner from ``tfdist.strategies`` decides *how* a step runs on
its strategy; ``training/step.py`` decides *what* a step does.

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
from typing import Any, Callable, Literal, Sequence

import keras
import numpy as np
import tensorflow as tf

from tfdist import _compat
from tfdist.config import check_directory, check_positive_int, invalid_argument
from tfdist.data.inputs import DEFAULT_GLOBAL_BATCH_SIZE, InputSource, as_input, check_evaluation_steps
from tfdist.models import check_features
from tfdist.strategies.factory import runner_for
from tfdist.training import precision as precision_lib
from tfdist.training import exchange, schedules
from tfdist.training.backup import Backup, Position, check_frequency, checkpoint_for, restore_on_every_worker
from tfdist.training.loop import EpochRunner, PreemptionWatcher
from tfdist.training.placement import rebuild_in_scope
from tfdist.training.callbacks import chief_writes_only
from tfdist.training.step import make_eval_step, make_predict_step, make_train_update

logger = logging.getLogger(__name__)

ModelOrBuilder = keras.Model | Callable[[], keras.Model]


def _in_scope(strategy: tf.distribute.Strategy, model: keras.Model) -> bool:
    variables = model.variables
    return bool(variables) and all(
        strategy.extended.variable_created_in_scope(getattr(v, "value", v)) for v in variables)


def _optimizer_parts(optimizer: Any) -> tuple[type, dict[str, Any], dict[str, Any] | None]:
    """Returns (class, config, loss-scale config or None) of an optimizer or its name."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        scale = {"initial_scale": float(optimizer.initial_scale),
                 "dynamic_growth_steps": int(optimizer.dynamic_growth_steps)}
        cls, config, _ = _optimizer_parts(optimizer.inner_optimizer)
        return cls, config, scale
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        try:
            optimizer = keras.optimizers.get(optimizer)
        except ValueError as e:
            raise invalid_argument("optimizer", optimizer, "a Keras optimizer or its name, e.g. 'adam'") from e
    elif optimizer.built:
        logger.warning("The optimizer was already built outside the strategy scope; tfdist "
                       "rebuilds it from its config and its slot variables start afresh.")
    return type(optimizer), optimizer.get_config(), None


def _check_loss(loss: Any) -> None:
    # A misspelt name would otherwise fail only at the first step, deep inside compile.
    expected = "a Keras loss, its name, or a callable(y_true, y_pred)"
    if loss is None:
        raise invalid_argument("loss", None, expected)
    if isinstance(loss, str):
        try:
            keras.losses.get(loss)
        except ValueError:
            raise invalid_argument("loss", loss, expected) from None


def _rebuild_metric(metric: Any) -> Any:
    if isinstance(metric, keras.metrics.Metric):
        return metric.__class__.from_config(metric.get_config())
    return metric


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
            batches instead of every batch), ending calls at ``backup_freq``
            boundaries. ``trainer.steps_per_execution`` holds the value in use
            once ``fit`` started.
        lr_scaling: ``"linear"`` multiplies the learning rate by
            ``k * global_batch_size / base_global_batch_size`` (Goyal et al.).
        base_global_batch_size: The batch size the base learning rate is for.
        warmup_steps: Ramp the learning rate linearly over this many updates
            (from the base rate when scaling, else from 0).
        warmup_epochs: The same in epochs; give at most one of the two.
        backup_dir: Fault tolerance: where to keep a step-exact backup (model,
            optimizer, loss scale, counters, epoch and position in it); any
            ``tf.io.gfile`` path. A restarted ``fit`` resumes at the exact
            update of the last backup, skipping the micro-batches already
            trained on (each epoch's data order depends only on the seed and
            the epoch). Only the chief writes, with an atomic commit (see
            :mod:`tfdist.training.backup` for which filesystems make it so).
            Every worker restores the chief's backup, so with several workers
            it must be shared storage (else a clear error). On SIGTERM the run
            saves at the next step boundary and exits with code 75, which
            ``tfdist launch`` restarts. Restoring loads weight files: use a
            trusted directory. Without ``backup_dir``, SIGTERM stops every
            worker at the same step boundary and exits with code 143.
        backup_freq: ``"epoch"`` or a number of optimizer updates between
            backups (a backup is also taken at every epoch end).
        keep_backup: Keep the backup after a successful run (default: remove it).
        gradient_compression: ``"bf16"`` or ``"fp16"`` all-reduces the
            gradients in 16 bits (half the bytes) and casts them back to
            float32 at once; fp16 is scaled per bucket so the sum cannot
            overflow. Changes numerics slightly (a bf16 value has 8
            significant bits); ``None`` (default) exchanges float32.
        bucket_bytes: Bucketed all-reduce: gradients in reverse layer order,
            about this many bytes per all-reduce, each started as soon as
            its gradients exist (overlapping the backward pass). The sums are
            those of the single all-reduce. ``None`` (default): one packed
            all-reduce. See :mod:`tfdist.training.exchange`.
        keep_backups: How many of the newest backups ``backup_dir`` holds while
            training (and after it, with ``keep_backup``); older ones are
            deleted once a newer one is committed. Only the newest is resumed
            from; ``state.json`` lists the kept ones and their positions.

    With ``mixed_float16``, losses are scaled before the backward pass and the
    summed gradients unscaled once per update; an update whose gradients are
    not finite is skipped (the loss scale halves) and counted in the logs as
    ``skipped_updates``, next to ``loss_scale``. With scaling or warmup the logs
    carry ``learning_rate``.

    Raises:
        ValueError: For an unknown precision or loss name, a non-positive step
            count, a ``backup_dir`` that is a file, or a model that cannot be
            placed in the strategy scope.
    """

    def __init__(self, model: ModelOrBuilder, *, strategy: tf.distribute.Strategy | None = None,
                 optimizer: Any = "adam", loss: Any = None, metrics: Sequence[Any] | None = None,
                 precision: precision_lib.Precision = "float32", accumulation_steps: int = 1,
                 steps_per_execution: int | Literal["auto"] = "auto", lr_scaling: schedules.LRScaling = "none",
                 base_global_batch_size: int = 256, warmup_steps: int | None = None,
                 warmup_epochs: float | None = None, backup_dir: str | None = None,
                 backup_freq: int | str = "epoch", keep_backup: bool = False, keep_backups: int = 1,
                 gradient_compression: exchange.Compression | None = None,
                 bucket_bytes: int | None = None) -> None:
        precision_lib.check_precision(precision)
        self.gradient_compression = exchange.check_compression(gradient_compression)
        self.bucket_bytes = exchange.check_bucket_bytes(bucket_bytes)
        check_positive_int("accumulation_steps", accumulation_steps)
        if steps_per_execution != "auto" and (isinstance(steps_per_execution, bool) or not isinstance(
                steps_per_execution, int) or steps_per_execution < 1):
            raise invalid_argument("steps_per_execution", steps_per_execution, "a positive integer or 'auto'")
        _check_loss(loss)
        check_frequency("backup_freq", backup_freq, "optimizer updates")
        check_directory("backup_dir", backup_dir)
        self.backup_dir = backup_dir
        self.backup_freq = backup_freq
        self.keep_backup = keep_backup
        self.keep_backups = check_positive_int("keep_backups", keep_backups)
        self._checkpoint: tf.train.Checkpoint | None = None
        self._lr_plan = schedules.LRPlan(lr_scaling, base_global_batch_size, warmup_steps, warmup_epochs)
        self.strategy = strategy or tf.distribute.get_strategy()
        self._runner = runner_for(self.strategy)
        if precision == "auto" and isinstance(model, keras.Model):
            precision = model.dtype_policy.name  # a model already made keeps the policy it was made with
        # "auto" becomes a concrete policy; a policy the device runs slowly warns once, on the chief.
        self.precision = precision_lib.resolve_precision(precision, is_chief=self._runner.is_chief)
        opt_cls, opt_config, loss_scale = _optimizer_parts(optimizer)
        self.accumulation_steps = self._take_keras_accumulation(opt_config, accumulation_steps)
        self._steps_per_execution = steps_per_execution  # as given: "auto" is resolved by each fit
        self.steps_per_execution = steps_per_execution
        self._schedule: schedules.ScaledWarmup | None = None
        if self._lr_plan.active:
            self._schedule = self._lr_plan.schedule_for(opt_config["learning_rate"])
            opt_config["learning_rate"] = self._schedule
        _compat.apply()
        with precision_lib.dtype_policy(self.precision), self.strategy.scope():
            self.model = self._place_model(model)
            opt = opt_cls.from_config(opt_config)
            if loss_scale is not None:
                opt = keras.optimizers.LossScaleOptimizer(opt, **loss_scale)
            opt = precision_lib.wrap_optimizer(opt, self.precision)
            self.model.compile(optimizer=opt, loss=loss,
                               metrics=[_rebuild_metric(m) for m in (metrics or [])])
            self._skipped_updates = None
            if isinstance(opt, keras.optimizers.LossScaleOptimizer):
                self._skipped_updates = tf.Variable(
                    0, dtype=tf.int64, trainable=False, name="skipped_updates",
                    synchronization=tf.VariableSynchronization.ON_WRITE,
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self._train_fns: dict[tuple[int, int], Any] = {}
        self._eval_fn = None
        self._predict_fn = None
        self._built_for: Any = None

    def _resolve_steps_per_execution(self, callbacks: Sequence[keras.callbacks.Callback]) -> int:
        """``steps_per_execution`` for this fit: the int given, or what ``"auto"`` picks.

        Only the callbacks and the runner decide (never timing, nor which
        process is the chief): every worker must split an epoch into the same
        calls, since each call ends with collectives (logs, preemption vote).
        """
        if self._steps_per_execution != "auto":
            return self._steps_per_execution
        hooks = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end")
        # A hook counts whether the class overrides it or the instance sets it
        # (keras.callbacks.LambdaCallback assigns its hooks in __init__).
        per_batch = [type(c).__name__ for c in callbacks
                     if any(h in vars(c) or getattr(type(c), h) is not getattr(keras.callbacks.Callback, h)
                            for h in hooks)]
        if per_batch:
            logger.info("steps_per_execution='auto': one update per call, for the batch hooks of %s.",
                        ", ".join(per_batch))
            return 1
        return int(getattr(self._runner, "auto_steps_per_execution", 1))

    def _take_keras_accumulation(self, opt_config: dict[str, Any], accumulation_steps: int) -> int:
        """Moves Keras's ``gradient_accumulation_steps`` (which fails under tf.distribute) to ours."""
        keras_steps = opt_config.get("gradient_accumulation_steps")
        if not keras_steps:
            return accumulation_steps
        if accumulation_steps not in (1, keras_steps):
            raise invalid_argument(
                "accumulation_steps", accumulation_steps, f"1 or {keras_steps}",
                note=f"The optimizer also sets gradient_accumulation_steps={keras_steps}; set only "
                     "Trainer(accumulation_steps=...).")
        logger.info("Using the optimizer's gradient_accumulation_steps=%d as Trainer(accumulation_steps=%d): "
                    "Keras's own accumulation fails under tf.distribute (merge_call).", keras_steps, keras_steps)
        opt_config["gradient_accumulation_steps"] = None
        return keras_steps

    # -- construction -------------------------------------------------------
    def _place_model(self, model: ModelOrBuilder) -> keras.Model:
        if isinstance(model, keras.Model):
            precision_lib.check_model_policy(model, self.precision)
            if not model.variables:
                return model  # unbuilt: its variables are created when tfdist builds it, inside the scope
            if _in_scope(self.strategy, model):
                return model
            return rebuild_in_scope(model)
        if callable(model):
            built = model()
            if not isinstance(built, keras.Model):
                raise invalid_argument("model", built, "a builder that returns a keras.Model")
            return built
        note = (f"For a built-in model pass `lambda: tfdist.models.get({model!r})`." if isinstance(model, str) else "")
        raise invalid_argument("model", model if isinstance(model, str) else type(model).__name__,
                               "a keras.Model or a zero-arg builder", note=note)

    def _input(self, data: Any, global_batch_size: int | None, training: bool, argument: str) -> InputSource:
        source = as_input(data, input_context=self._runner.input_context(), global_batch_size=global_batch_size,
                          training=training, argument=argument)
        check_features(self.model, source.element_spec, argument=argument)
        return source

    def _build(self, source: InputSource) -> None:
        if self._built_for is None:
            with self.strategy.scope():
                self.model._symbolic_build(data_batch=source.element_spec)
            self._built_for = source.global_batch_size

    def _logs(self) -> dict[str, tf.Tensor]:
        """Metric results plus tfdist's own state, in cross-replica context."""
        logs = dict(self._metrics_result())
        optimizer = self.model.optimizer
        if self.accumulation_steps > 1:
            logs["updates"] = optimizer.iterations
        if self._schedule is not None:
            logs["learning_rate"] = self._schedule(optimizer.iterations)
        if self._skipped_updates is not None:
            logs["loss_scale"] = optimizer.dynamic_scale
            logs["skipped_updates"] = self._skipped_updates
        return logs

    def _metrics_result(self) -> dict[str, tf.Tensor]:
        # A runner may reduce all metric state in one collective (SyncRunner.metrics_result).
        packed = getattr(self._runner, "metrics_result", None)
        return packed(self.model) if packed is not None else self.model.get_metrics_result()

    def _train_function(self, global_batch_size: int, micro_batches: int):
        key = (global_batch_size, micro_batches)
        if key not in self._train_fns:
            update = make_train_update(self.model, self.model.optimizer, global_batch_size=global_batch_size,
                                       accumulation_steps=micro_batches,
                                       num_replicas=self.strategy.num_replicas_in_sync,
                                       skipped_updates=self._skipped_updates, bucket_bytes=self.bucket_bytes,
                                       gradient_compression=self.gradient_compression)
            self._train_fns[key] = self._runner.compile_loop(update, self._logs, batches_per_call=micro_batches,
                                                             name="train_function", model=self.model)
        return self._train_fns[key]

    def _eval_function(self):
        if self._eval_fn is None:
            self._eval_fn = self._runner.compile_loop(make_eval_step(self.model), self._metrics_result,
                                                      batches_per_call=1, name="test_function", training=False)
        return self._eval_fn

    def _start(self, fn, iterator, num_calls: int) -> Any:
        with _compat.gradients_already_summed(self.model.optimizer, num_replicas=self.strategy.num_replicas_in_sync):
            return self._runner.run(fn, iterator, num_calls)

    def _run(self, fn, iterator, num_calls: int) -> dict[str, float]:
        return self._runner.fetch(self._start(fn, iterator, num_calls))

    # -- public loop --------------------------------------------------------
    @property
    def is_chief(self) -> bool:
        """Whether this process is the one that writes logs and checkpoints."""
        return self._runner.is_chief

    def fit(self, data: Any, *, epochs: int = 1, steps_per_epoch: int | None = None,
            global_batch_size: int | None = None, validation_data: Any = None,
            validation_steps: int | None = None, callbacks: Sequence[keras.callbacks.Callback] = (),
            verbose: str | int = "auto", initial_epoch: int = 0) -> keras.callbacks.History:
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
        check_positive_int("epochs", epochs)
        check_positive_int("steps_per_epoch", steps_per_epoch, allow_none=True)
        check_positive_int("validation_steps", validation_steps, allow_none=True)
        if isinstance(initial_epoch, bool) or not isinstance(initial_epoch, int) or initial_epoch < 0:
            raise invalid_argument("initial_epoch", initial_epoch, "a non-negative integer")
        if verbose not in ("auto", 0, 1, 2):
            raise invalid_argument("verbose", verbose, "'auto', 0, 1 or 2")
        callbacks = () if callbacks is None else callbacks
        if isinstance(callbacks, keras.callbacks.Callback) or not all(
                isinstance(c, keras.callbacks.Callback) for c in callbacks):
            raise invalid_argument("callbacks", callbacks, "a list of keras.callbacks.Callback")
        if steps_per_epoch is None and self._runner.requires_steps_per_epoch:
            raise invalid_argument(
                "steps_per_epoch", None, "a positive integer under strategy 'parameter_server'",
                note="Its workers read their datasets independently and repeat them, so an epoch has no "
                     "natural end: say how many batches make one.")
        source = self._input(data, global_batch_size, True, "data")
        steps = steps_per_epoch or source.steps_per_epoch
        if steps_per_epoch and source.steps_per_epoch and steps_per_epoch > source.steps_per_epoch:
            logger.info("steps_per_epoch=%d is more than one pass over the data (%d batches): the data repeats.",
                        steps_per_epoch, source.steps_per_epoch)
        if steps is None:
            raise invalid_argument("steps_per_epoch", None, "a positive integer",
                                   note="The data's length is unknown (e.g. a repeated dataset).")
        val_source = None
        if validation_data is not None:
            val_source = self._input(validation_data, global_batch_size or source.global_batch_size,
                                     False, "validation_data")
            check_evaluation_steps("validation_steps", validation_steps, val_source)
        k = self.accumulation_steps
        full_updates, last_window = divmod(steps, k)
        if self._schedule is not None:
            self._lr_plan.resolve(self._schedule, effective_global_batch_size=source.global_batch_size * k,
                                  updates_per_epoch=full_updates + bool(last_window))
        self._build(source)
        train_fn = self._train_function(source.global_batch_size, k)

        self.steps_per_execution = self._resolve_steps_per_execution(callbacks)
        verbose_level = 1 if verbose == "auto" else int(verbose)
        model = self.model
        model.stop_training = False
        backup = self._backup()
        position = restore_on_every_worker(backup, self._runner)  # every worker: the chief's position
        if position is not None:
            initial_epoch = position.epoch
            if self.is_chief:  # a warning, so the user sees why an epoch's progress bar starts again
                logger.warning("Resumed from update %d (epoch %d, step %d) of the backup in %s.",
                               position.updates, position.epoch + 1, position.step, self.backup_dir)
        persistent = None  # with steps_per_epoch, one iterator runs on across epochs (Keras's rule)
        with chief_writes_only(callbacks, is_chief=self.is_chief, task_label=self._runner.task_label), \
                PreemptionWatcher(has_backup=backup is not None) as watcher:
            # Made inside chief_writes_only: set_model makes TensorBoard cache its
            # log paths, which must already be the redirected ones on non-chiefs.
            cb_list = keras.callbacks.CallbackList(
                list(callbacks), add_history=True, add_progbar=bool(verbose_level) and self.is_chief,
                verbose=verbose_level, epochs=epochs, steps=steps, model=model)
            run = EpochRunner(self, cb_list, source, train_fn, steps, backup,
                              updates=position.updates if position else 0)
            run.watcher = watcher  # SIGTERM: save and exit 75 with a backup, else stop and exit 143
            cb_list.on_train_begin()
            for epoch in range(initial_epoch, epochs):
                first_step = position.step if position is not None and epoch == position.epoch else 0
                # Resuming skips the batches already trained on inside tf.data, not by next() calls.
                if steps_per_epoch:
                    if persistent is None:
                        # One repeated stream from epoch 0: skip every step trained on since.
                        done = epoch * steps + first_step if position is not None else 0
                        persistent = self._runner.make_iterator(self._runner.distribute(
                            source.repeated().skipping(done)))
                    iterator = persistent
                else:
                    iterator = self._runner.make_iterator(self._runner.distribute(
                        source.for_epoch(epoch).skipping(first_step)))
                model.reset_metrics()
                cb_list.on_epoch_begin(epoch)
                epoch_logs = run.epoch(epoch, iterator, first_step=first_step)
                if val_source is not None:
                    val_logs = self._evaluate_source(val_source, validation_steps)
                    epoch_logs.update({f"val_{name}": v for name, v in val_logs.items()})
                cb_list.on_epoch_end(epoch, epoch_logs)
                if backup is not None:
                    backup.save(Position(epoch + 1, 0, run.updates))
                if model.stop_training:
                    break
            cb_list.on_train_end(run.logs)
        if backup is not None and not self.keep_backup:
            backup.remove()
        return model.history

    def _backup(self) -> Backup | None:
        if self.backup_dir is None:
            return None
        if self._checkpoint is None:
            extra = {} if self._skipped_updates is None else {"skipped_updates": self._skipped_updates}
            self._checkpoint = checkpoint_for(self.model, self.model.optimizer, **extra)
        return Backup(self.backup_dir, self._checkpoint, is_chief=self.is_chief,
                      task_label=self._runner.task_label, keep_backups=self.keep_backups)

    def _evaluate_source(self, source: InputSource, steps: int | None) -> dict[str, float]:
        steps = steps or source.steps_per_epoch
        if steps is None:
            raise invalid_argument("validation_steps", None, "a positive integer",
                                   note="The evaluation data's length is unknown.")
        self._build(source)
        fn = self._eval_function()
        iterator = self._runner.make_iterator(self._runner.distribute(source, training=False))
        self.model.reset_metrics()
        logs: dict[str, float] = {}
        done = 0
        while done < steps:
            n = min(self.steps_per_execution if self.steps_per_execution != "auto" else
                    int(getattr(self._runner, "auto_steps_per_execution", 1)), steps - done)
            logs = self._run(fn, iterator, n)
            done += n
        self._runner.join()
        return logs

    def evaluate(self, data: Any, *, steps: int | None = None,
                 global_batch_size: int | None = None) -> dict[str, float]:
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
        source = as_input(data, input_context=self._runner.input_context(), global_batch_size=global_batch_size,
                          training=False, argument="data", fallback_global_batch_size=self._built_for)
        check_evaluation_steps("steps", steps, source)
        return self._evaluate_source(source, steps)

    def predict(self, data: Any, *, steps: int | None = None, global_batch_size: int | None = None) -> Any:
        """Runs the model on ``data``, distributed like :meth:`evaluate`, and returns outputs in input order.

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
        if isinstance(data, (tuple, list)) and 2 <= len(data) <= 3:
            data = data[0]
        if isinstance(data, (np.ndarray, dict)) or hasattr(data, "__array__"):
            gbs = global_batch_size or DEFAULT_GLOBAL_BATCH_SIZE
            data = tf.data.Dataset.from_tensor_slices(data).batch(gbs)
        source = self._input(data, global_batch_size, False, "data")
        if not self.model.built:
            with self.strategy.scope():
                x_spec = keras.utils.unpack_x_y_sample_weight(source.element_spec)[0]
                self.model.build(tf.nest.map_structure(lambda s: s.shape, x_spec))
        if self._predict_fn is None:
            self._predict_fn = self._runner.compile_predict(make_predict_step(self.model))
        outputs = []
        for batch in self._runner.distribute(source, training=False):
            if steps is not None and len(outputs) >= steps:
                break
            outputs.append(tf.nest.map_structure(np.asarray, self._predict_fn(batch)))
        if not outputs:
            raise invalid_argument("data", type(data).__name__, "at least one batch to predict on")
        return tf.nest.map_structure(lambda *parts: np.concatenate(parts, axis=0), *outputs)
