"""The one place that chooses and combines the updates: plain, sharded (ZeRO), pipeline, both.

Every update is a `tfdist.training.step.update.TrainUpdate` (the template: the loss normalised
by the global batch, the logs, the accumulation, one exchange, one optimizer update); each
capability replaces a part of it:

| ``pipeline`` | ``sharding`` | the update | replaces | the optimizer is built |
|---|---|---|---|---|
| no | no | ``TrainUpdate`` | nothing | by Keras |
| yes | no | ``PipelineUpdate`` | the micro-step (the stages) | after the stages are placed |
| no | yes | ``ShardedUpdate`` | the exchange and the update | on the master shards |
| yes | yes | `ShardedPipelineUpdate` | both | stages placed, then shards |
| no | ``"parameters"`` | ``ParametersUpdate`` | the micro-step, exchange, update | on the blocks |

Under ``sharding="parameters"`` (ZeRO-3) the model's trainable variables are cut into blocks
at each fit's start and gathered whole again at its end (`start_fit`, `end_fit`;
`tfdist.training.zero.parameters`). Sharding on one replica trains unsharded (with a log
line). Neither `tfdist.training.zero` nor `tfdist.training.pipeline` imports the other: they
meet here only. Local SGD
(`tfdist.training.local_sgd`) replaces the exchange of the plain update (``LocalUpdate``); the
Trainer refuses it beside sharding or a pipeline.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tfdist.strategies.base import Runner
from tfdist.training.local_sgd.options import LocalSGDOptions
from tfdist.training.local_sgd.sync import LocalState
from tfdist.training.local_sgd.update import LocalUpdate
from tfdist.training.options import ExchangeOptions
from tfdist.training.pipeline.update import Pipeline, PipelineUpdate
from tfdist.training.step.update import TrainUpdate
from tfdist.training.zero.parameters import ParameterState
from tfdist.training.zero.parameters_update import ParametersUpdate
from tfdist.training.zero.state import ShardedState, check_optimizer, log_one_replica
from tfdist.training.zero.update import ShardedUpdate


class ShardedPipelineUpdate(ShardedUpdate, PipelineUpdate):
    """The hybrid on sharded optimizer state: `PipelineUpdate`'s micro-step (the stages), and
    `ShardedUpdate`'s exchange and update (each worker keeps and updates its block of each
    stage's variables, on that stage's device; then the blocks are all-gathered)."""


class Updates:
    """The update of one model on one runner, and what builds its optimizer.

    Args:
        model: The compiled model.
        runner: The strategy's runner.
        exchange: How the gradients travel, and whether the optimizer state is sharded.
        pipeline: The model's pipeline stages, or None.
        skipped_updates: The loss-scaling skip counter, when loss scaling.
        local_sgd: Local SGD or DiLoCo (`tfdist.training.local_sgd`), or None.
    """

    def __init__(
        self,
        model: keras.Model,
        runner: Runner,
        *,
        exchange: ExchangeOptions,
        pipeline: Pipeline | None = None,
        skipped_updates: tf.Variable | None = None,
        local_sgd: LocalSGDOptions | None = None,
    ) -> None:
        self.model = model
        self.runner = runner
        self.exchange = exchange
        self.pipeline = pipeline
        self.skipped_updates = skipped_updates
        # The sharded optimizer state (or, under "parameters", the blocks), once built.
        self.sharded: ShardedState | ParameterState | None = None
        self.local_sgd = local_sgd
        self.local: LocalState | None = None  # local SGD's state, once built (`start_fit`)

    def start_fit(self) -> None:
        """At a fit's start, the model built: local SGD's state built, and anchored at the
        model's parameters (`tfdist.training.local_sgd.sync.LocalState.anchor`): every fit ends
        on a sync (`end_fit`), so they are the last synced ones unless changed since; a backup
        restored after this brings its own mid-round anchor."""
        if isinstance(self.sharded, ParameterState):
            self.sharded.cut()  # the first fit's build cut already
        if self.local_sgd is None:
            return
        if self.local is None:
            strategy = self.runner.strategy
            self.local = LocalState(self.model, strategy, self.local_sgd, self.exchange)
        self.local.anchor()

    def end_fit(self) -> None:
        """At a fit's end, every worker, before ``on_train_end``: local SGD syncs a partial
        round (`tfdist.training.local_sgd.sync.LocalState.finish`); sharded parameters are
        gathered whole into the model's variables (`ParameterState.restore`)."""
        if self.local is not None:
            self.local.finish()
        if isinstance(self.sharded, ParameterState):
            self.sharded.restore()

    @property
    def storage_generation(self) -> int:
        """Changes whenever the model's trainable variables change storage (cut into blocks at a
        fit's start, whole again at its end, under ``"parameters"``): what was compiled on the
        old storage must be compiled again."""
        return self.sharded.generation if isinstance(self.sharded, ParameterState) else 0

    @property
    def parameters(self) -> ParameterState | None:
        """The sharded parameters while a fit holds them as blocks, else None."""
        state = self.sharded
        return state if isinstance(state, ParameterState) and not state.whole else None

    def optimizer_builder(self) -> Any:
        """What builds the optimizer: the pipeline's stages placed first (the slots follow their
        variables), then the sharded state's blocks (on each variable's devices), else Keras's
        (None)."""
        model, pipeline, sharding = self.model, self.pipeline, self.exchange.sharding
        unsharded = None if pipeline is None else pipeline.optimizer_builder(model)
        if sharding is None:
            return unsharded
        check_optimizer(model.optimizer, sharding)  # e.g. built since
        if self.runner.strategy.num_replicas_in_sync == 1:
            log_one_replica(sharding, self.runner)
            return unsharded

        def build(variables: Any) -> None:
            if sharding == "parameters":  # refused beside a pipeline (the Trainer)
                self.sharded = ParameterState(
                    model,
                    self.runner.strategy,
                    keep_whole_below=self.exchange.keep_whole_below,
                    units=self.exchange.units,
                )
                return
            if pipeline is not None:
                pipeline.place(model)
            self.sharded = ShardedState(
                model, self.runner.strategy, sharding, colocate=pipeline is not None
            )

        return build

    def make(self, global_batch_size: int, micro_batches: int) -> TrainUpdate:
        """The replica step of one update of ``micro_batches`` batches of ``global_batch_size``."""
        kind: type[TrainUpdate] = TrainUpdate
        more: dict[str, Any] = {}
        if self.pipeline is not None:
            kind, more = PipelineUpdate, self.pipeline.update_arguments()
        if self.local is not None:  # refused beside a pipeline and sharding (the Trainer)
            kind, more = LocalUpdate, {"state": self.local}
        if isinstance(self.sharded, ParameterState):
            kind = ParametersUpdate
            more["state"] = self.sharded
        elif self.sharded is not None:
            kind = ShardedUpdate if self.pipeline is None else ShardedPipelineUpdate
            more["state"] = self.sharded
        return kind(
            self.model,
            self.model.optimizer,
            global_batch_size=global_batch_size,
            accumulation_steps=micro_batches,
            num_replicas=self.runner.strategy.num_replicas_in_sync,
            skipped_updates=self.skipped_updates,
            exchange=self.exchange,
            **more,
        )
