"""The compiled functions of one model on one runner: train, evaluate, predict, and their logs.

Each is built once and cached, as Keras's ``make_train_function`` does: a
train function per ``(global_batch_size, micro-batches per update)`` (an
epoch whose micro-batches do not fill its last update needs a second one),
one evaluation and one predict function.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator, Mapping
from typing import Any

import keras
import tensorflow as tf

from tfdist import _compat
from tfdist._compat.keras_internals.keras_training import symbolic_build
from tfdist.config import invalid_argument
from tfdist.data.inputs import InputSource
from tfdist.strategies.base import LoopOptions, Runner
from tfdist.training.build import lr_schedules as schedules
from tfdist.training.fit.one_epoch import StartUpdates
from tfdist.training.local_sgd.options import LocalSGDOptions
from tfdist.training.options import ExchangeOptions, LRScaling
from tfdist.training.pipeline.update import Pipeline
from tfdist.training.step.exchange import log_nothing_to_exchange
from tfdist.training.step.inference import make_eval_step, make_predict_step
from tfdist.training.step.model_steps import (
    Overrides,
    build_optimizers,
    callable_model,
    make_custom_eval_step,
    make_custom_train_update,
    select_logs,
)
from tfdist.training.updates import Updates
from tfdist.training.zero.parameters import ParameterState
from tfdist.training.zero.parameters_update import make_parameters_eval_step
from tfdist.training.zero.state import ShardedState, log_replica_bytes, replica_bytes


class StepFunctions:
    """Builds, caches and starts the compiled functions of ``model`` on ``runner``.

    Args:
        model: The compiled model, its variables in the strategy scope.
        runner: The strategy's runner.
        accumulation_steps: Micro-batches per update (``k``), for the logs.
        exchange: How gradients are all-reduced, or None for the default.
        schedule: The learning-rate schedule when scaling or warmup is on.
        skipped_updates: The loss-scaling skip counter, when loss scaling.
        pipeline: The model's pipeline stages (`tfdist.training.pipeline.options`), or None.
        local_sgd: Local SGD or DiLoCo (`tfdist.training.local_sgd`), or None.

    A model's own ``train_step``/``test_step``/``predict_step`` replaces
    tfdist's replica step of that kind (see `tfdist.training.step.model_steps`).
    """

    def __init__(
        self,
        model: keras.Model,
        runner: Runner,
        *,
        accumulation_steps: int,
        exchange: ExchangeOptions | None = None,
        schedule: schedules.ScaledWarmup | None = None,
        skipped_updates: tf.Variable | None = None,
        pipeline: Pipeline | None = None,
        local_sgd: LocalSGDOptions | None = None,
    ) -> None:
        self.model = model
        self.pipeline = pipeline
        self.runner = runner
        self.accumulation_steps = accumulation_steps
        self.exchange = exchange or ExchangeOptions()
        self.schedule = schedule
        self.skipped_updates = skipped_updates
        self.built_for: int | None = None  # the global batch size of the first input built from
        self.updates = Updates(
            model,
            runner,
            exchange=self.exchange,
            pipeline=pipeline,
            skipped_updates=skipped_updates,
            local_sgd=local_sgd,
        )
        self.overrides = Overrides.of(model)
        # The log keys a user's train_step / test_step returns (known once traced).
        self._train_keys: list[str] = []
        self._eval_keys: list[str] = []
        self._train: dict[tuple[int, int], Any] = {}
        self._until_exhausted: dict[int, Any] = {}  # by global batch size: data of unknown length
        self._eval = None
        self._eval_until_exhausted = None
        self._predict = None
        self._compiled_on = 0  # the storage generation inference was compiled on

    @property
    def sharded(self) -> ShardedState | ParameterState | None:
        """The sharded optimizer state (or parameters), once built (`tfdist.training.updates`)."""
        return self.updates.sharded

    @property
    def train_functions(self) -> Mapping[tuple[int, int], Any]:
        """The train functions so far, by ``(global_batch_size, micro_batches)`` (read-only)."""
        return types.MappingProxyType(self._train)

    def build(self, source: InputSource) -> None:
        """Builds the model, metrics and optimizer from ``source``'s batch spec, once, in scope."""
        if self.built_for is None:
            with self.runner.strategy.scope():
                if self.overrides.train_step and not callable_model(self.model):
                    build_optimizers(self.model)  # e.g. a GAN: no call(), only its parts
                else:
                    symbolic_build(
                        self.model,
                        source.element_spec,
                        build_optimizer=self.updates.optimizer_builder(),
                    )
            if self.pipeline is not None:  # placed already, unless the optimizer was built
                self.pipeline.place(self.model)
            self.built_for = source.global_batch_size
            log_nothing_to_exchange(
                self.exchange.compression, self.exchange.bucket_bytes, self.runner
            )
            if self.sharded is not None:
                log_replica_bytes(self.replica_bytes(), self.exchange.sharding, self.runner)

    def replica_bytes(self) -> dict[str, Any]:
        """Bytes each replica holds, by kind, and the same unsharded (once built)."""
        return replica_bytes(
            self.model,
            num_replicas=self.runner.strategy.num_replicas_in_sync,
            sharding=None if self.sharded is None else self.exchange.sharding,
            accumulation_steps=self.accumulation_steps,
            full_shapes=None if self.sharded is None else self.sharded.full_shapes,
            kept=frozenset() if self.sharded is None else self.sharded.kept_ids,
            units=None if self.sharded is None else self.sharded.units,
        )

    def _fresh_inference(self) -> None:
        """Inference compiled on the model's storage of now: sharded parameters change it at
        each fit's start and end (`tfdist.training.updates.Updates.storage_generation`)."""
        generation = self.updates.storage_generation
        if generation != self._compiled_on:
            self._eval = self._eval_until_exhausted = self._predict = None
            self._compiled_on = generation

    def logs(self, outputs: Mapping[str, tf.Tensor] | None = None) -> dict[str, tf.Tensor]:
        """Metric results plus tfdist's own state, in cross-replica context.

        ``outputs``: a model's own ``train_step`` logs, averaged over the replicas
        (sync runners), which replace the metric results.
        """
        if outputs is not None:
            logs = dict(outputs)
        elif self.overrides.train_step:
            logs = select_logs(self.metrics_result(), self._train_keys)
        else:
            logs = dict(self.metrics_result())
        optimizer = self.model.optimizer
        if self.accumulation_steps > 1:
            logs["updates"] = optimizer.iterations
        if self.schedule is not None:
            logs["learning_rate"] = self.schedule(optimizer.iterations)
        if self.skipped_updates is not None and not self.overrides.train_step:
            logs["loss_scale"] = optimizer.dynamic_scale
            logs["skipped_updates"] = self.skipped_updates
        if self.updates.local is not None:  # local SGD: the syncs (adapting: inner steps) so far
            logs.update(self.updates.local.logs())
        return logs

    def metrics_result(self) -> dict[str, tf.Tensor]:
        """The model's metric results, in cross-replica context."""
        # A runner may reduce all metric state in one collective (SyncRunner.metrics_result).
        return self.runner.metrics_result(self.model)

    def train(self, global_batch_size: int, micro_batches: int) -> Any:
        """The train function for updates of ``micro_batches`` batches of ``global_batch_size``."""
        key = (global_batch_size, micro_batches)
        if key not in self._train and self.overrides.train_step:
            averaged = self.runner.reduces_step_outputs
            self._train[key] = self.runner.compile_loop(
                make_custom_train_update(self.model, self._train_keys, averaged=averaged),
                self.logs,
                LoopOptions("train_function", batches_per_call=micro_batches, outputs=averaged),
                model=self.model,
            )
        if key not in self._train:
            update = self.updates.make(global_batch_size, micro_batches)
            self._train[key] = self.runner.compile_loop(
                update.__call__,
                self.logs,
                LoopOptions("train_function", batches_per_call=micro_batches),
                model=self.model,
                cross_replica=update.cross_replica,
            )
        return self._train[key]

    def train_until_exhausted(self, global_batch_size: int) -> Any:
        """The train function for data of unknown length: one batch per update, stopping at its
        end (``LoopOptions(until_exhausted=True)``); its logs hold the updates it ran."""
        if global_batch_size not in self._until_exhausted:
            if self.overrides.train_step:
                averaged = self.runner.reduces_step_outputs
                replica_fn = make_custom_train_update(
                    self.model, self._train_keys, averaged=averaged
                )
            else:
                replica_fn = self.updates.make(global_batch_size, 1).__call__
            self._until_exhausted[global_batch_size] = self.runner.compile_loop(
                replica_fn,
                self.logs,
                LoopOptions("train_function", until_exhausted=True),
                model=self.model,
            )
        return self._until_exhausted[global_batch_size]

    def prepare_fit(
        self, source: InputSource, *, steps: int | None, lr_scaling: LRScaling | None
    ) -> StartUpdates:
        """Readies the train functions for a fit of ``steps`` micro-batches per epoch.

        Resolves the learning-rate schedule for this fit's batch, builds the
        model from ``source`` and makes the train function of full updates
        (traced lazily, but listed in `train_functions` from now on).
        ``steps=None``: the data's length is unknown, and each epoch runs until it is
        exhausted (`train_until_exhausted`), one micro-batch per update.

        Returns:
            ``start(micro_batches, iterator, num_updates)`` for the epoch loop.

        Raises:
            ValueError: Naming ``steps_per_epoch``, for ``steps=None`` with
                ``accumulation_steps > 1`` or a warmup counted in epochs.
        """
        k = self.accumulation_steps
        if self.pipeline is not None:
            self.pipeline.check_batch(source.global_batch_size)
        if steps is None:
            return self._prepare_until_exhausted(source, lr_scaling)
        if self.schedule is not None:
            # Before the first trace: the compiled step reads the schedule's numbers as constants.
            schedules.resolve(
                self.schedule,
                lr_scaling,
                effective_global_batch_size=source.global_batch_size * k,
                updates_per_epoch=-(-steps // k),  # a partial last window is one more update
            )
        self.build(source)
        self.updates.start_fit()
        gbs = source.global_batch_size

        def start(micro_batches: int, iterator: Any, num_updates: int) -> Any:
            return self.start(self.train(gbs, micro_batches), iterator, num_updates)

        self.train(gbs, k)
        return start

    def _prepare_until_exhausted(
        self, source: InputSource, lr_scaling: LRScaling | None
    ) -> StartUpdates:
        """``prepare_fit`` for data of unknown length (see there)."""
        if self.accumulation_steps > 1:
            raise invalid_argument(
                "steps_per_epoch",
                None,
                f"a positive integer with accumulation_steps={self.accumulation_steps}",
                note="The data's length is unknown (e.g. filter then batch, or a generator), so "
                "an epoch's last update could not be planned; pass steps_per_epoch, or give the "
                "dataset its length with tf.data.experimental.assert_cardinality.",
            )
        if lr_scaling is not None and lr_scaling.warmup_epochs is not None:
            raise invalid_argument(
                "steps_per_epoch",
                None,
                "a positive integer with a warmup counted in epochs (warmup_epochs)",
                note="The data's length is unknown, so an epoch's updates are too; pass "
                "steps_per_epoch, or count the warmup in updates (warmup_steps).",
            )
        if self.schedule is not None:
            schedules.resolve(
                self.schedule,
                lr_scaling,
                effective_global_batch_size=source.global_batch_size,
                updates_per_epoch=0,  # unused: no warmup in epochs
            )
        self.build(source)
        self.updates.start_fit()
        gbs = source.global_batch_size

        def start(micro_batches: int, iterator: Any, num_updates: int) -> Any:
            return self.start(self.train_until_exhausted(gbs), iterator, num_updates)

        return start

    def evaluation(self, *, until_exhausted: bool = False) -> Any:
        """The evaluation function (one batch per replica call); ``until_exhausted``: the one
        for data of unknown length, whose logs hold the batches it ran."""
        self._fresh_inference()
        if until_exhausted:
            if self._eval_until_exhausted is None:
                self._eval_until_exhausted = self._compile_evaluation(until_exhausted=True)
            return self._eval_until_exhausted
        if self._eval is None:
            self._eval = self._compile_evaluation(until_exhausted=False)
        return self._eval

    def _compile_evaluation(self, *, until_exhausted: bool) -> Any:
        if self.overrides.test_step:
            step = make_custom_eval_step(self.model, self._eval_keys)
        elif self.updates.parameters is not None:  # inside a fit: the weights are blocks
            step = make_parameters_eval_step(self.updates.parameters)
        else:
            step = make_eval_step(self.model, forward_fn=self._forward_fn())
        return self.runner.compile_loop(
            step,
            lambda: select_logs(self.metrics_result(), self._eval_keys),
            LoopOptions("test_function", training=False, until_exhausted=until_exhausted),
        )

    def predict(self) -> Any:
        """The predict function: one distributed batch in, all replicas' outputs out."""
        self._fresh_inference()
        if self.updates.parameters is not None:
            raise invalid_argument(
                "sharding",
                "parameters",
                "a predict after fit, or another sharding, for a predict during fit",
                note="During a fit the weights are blocks on the replicas; the model is whole "
                "again when the fit ends.",
            )
        if self._predict is None:
            if self.pipeline is not None:  # predict builds only the layers (before any fit)
                self.pipeline.place(self.model)
            self._predict = self.runner.compile_predict(
                make_predict_step(
                    self.model, custom=self.overrides.predict_step, forward_fn=self._forward_fn()
                )
            )
        return self._predict

    def _forward_fn(self) -> Any:
        """Inference's forward pass: through the pipeline's stages, or None (the model's)."""
        return None if self.pipeline is None else self.pipeline.forward_fn()

    def start(self, fn: Any, iterator: Any, num_calls: int) -> Any:
        """Starts ``fn`` for ``num_calls`` calls through the runner; returns its logs handle."""
        # The step all-reduces the gradients itself (once per update); the optimizer must not
        # again. Tracing reads the hook, and the runner may trace inside run().
        # A user's train_step applies through Keras's optimizer, which all-reduces (once per apply).
        if self.overrides.train_step:
            return self.runner.run(fn, iterator, num_calls)
        num_replicas = self.runner.strategy.num_replicas_in_sync
        with (
            _no_loss_named(self.model),
            _compat.gradients_already_summed(self.model.optimizer, num_replicas=num_replicas),
        ):
            return self.runner.run(fn, iterator, num_calls)

    def run(self, fn: Any, iterator: Any, num_calls: int) -> dict[str, float]:
        """Runs ``fn`` for ``num_calls`` calls and returns its logs as floats."""
        return self.runner.fetch(self.start(fn, iterator, num_calls))


#: The start of Keras's error when a step has no loss at all (``Trainer.compute_loss``).
KERAS_NO_LOSS = "No loss to compute."


@contextlib.contextmanager
def _no_loss_named(model: keras.Model) -> Iterator[None]:
    """Keras's "No loss to compute" (raised while the first step is traced, before anything
    runs) as tfdist's error naming ``loss``: compiled without one, as Keras allows for a model
    whose loss is its own ``add_loss``, the model added none."""
    try:
        yield
    except ValueError as e:
        if not str(e).startswith(KERAS_NO_LOSS) or model.loss is not None:
            raise
        raise invalid_argument(
            "loss",
            None,
            "a Keras loss, its name, or a callable(y_true, y_pred)",
            note=f"{type(model).__name__} adds no loss of its own (add_loss, weight "
            "regularisers), so there is nothing to train: pass loss= to the Trainer, or a model "
            "you compiled with a loss.",
        ) from None
