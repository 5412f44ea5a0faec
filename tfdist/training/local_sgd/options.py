"""``LocalSGDOptions`` and the refusals of ``Trainer(local_sgd=...)``, before anything trains.

Example (DiLoCo, Adam inside)::

    trainer = tfdist.Trainer(
        build_model, strategy=tfdist.make_strategy("multi_worker"), optimizer="adam",
        local_sgd=tfdist.LocalSGDOptions(
            sync_every=16, outer_optimizer=keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)
        ),
    )
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras

from tfdist.config import check_positive_int, invalid_argument
from tfdist.training.local_sgd.fragments import too_many
from tfdist.training.step.model_steps import Overrides


@dataclasses.dataclass(frozen=True)
class LocalSGDOptions:
    """Local SGD (``outer_optimizer=None``) or DiLoCo: synchronise every ``sync_every`` updates.

    Each replica (each worker of ``multi_worker``, each device of ``mirrored``) takes its own
    optimizer updates on its own batches, with no gradient all-reduce; every ``sync_every``
    updates (counted by ``optimizer.iterations``, so ``steps_per_execution`` does not move
    them) the replicas average their parameters in one all-reduce. With an ``outer_optimizer``
    (DiLoCo, Douillard et al. 2023: ``keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)``)
    the averaged change since the last sync is the outer gradient, applied by that optimizer
    to the last synced parameters. A fit whose updates are not a multiple of ``sync_every``
    ends with one more sync of its partial round, so ``fit`` returns one model; validation at
    an epoch's end between syncs evaluates each replica's own copy on its share of the batches.
    See `tfdist.training.local_sgd` for what is averaged and what stays local.

    With ``adapt_to_stragglers=True`` a slower worker takes fewer inner steps in each round
    (about ``H`` times its rate over the fastest's, at least 1) and skips the rest, reading and
    dropping their batches, so the workers reach each sync together; the sync weighs each
    worker's parameters (DiLoCo: its change) by the steps it took. With no straggler it is
    plain local SGD, bit for bit (an ``Embedding``'s sparse rows too: a skip's have none). The
    rates are measured in the train loop and agreed at each sync
    (`tfdist.training.local_sgd.stragglers`). It needs the data's length (``steps_per_epoch``
    or a sized dataset) and, on ``multi_worker``,
    ``stragglers=None`` (the straggler report times each update in a way that cannot skip
    one); on one worker (``mirrored``, ``one_device``) every replica runs in one process and
    there is nothing to adapt: it trains as without.

    With ``fragments=K`` (streaming DiLoCo, Douillard et al. 2025) the averaged variables are
    cut, in model order, into ``K`` contiguous fragments balanced by bytes, synced in turn: one
    fragment every ``H / K`` updates, each every ``H`` updates, so each sync carries about
    ``1/K`` of the model and the bytes per update stay ``1/H`` of it. With DiLoCo each fragment
    has its own copy of the outer optimizer. The sync is not overlapped with the next inner
    steps (see `tfdist.training.local_sgd.fragments`).

    Args:
        sync_every: Updates between synchronisations, ``H`` (1: every update).
        outer_optimizer: A Keras optimizer for the outer gradient, or None (plain averaging).
            It is copied into the strategy scope, as the Trainer's own optimizer is.
        adapt_to_stragglers: Whether a slower worker takes fewer inner steps per round, the
            sync weighted by the steps taken (the logs gain ``local_steps``: this worker's inner
            steps since the Trainer was built; a backup does not hold it).
        fragments: ``K``, the fragments synced in turn (1: the whole model at each sync); a
            divisor of ``sync_every``, at most the model's trainable variables.

    Raises:
        ValueError: Naming the argument, for a ``sync_every`` that is not a positive integer
            or an ``outer_optimizer`` that is not a Keras optimizer, or an
            ``adapt_to_stragglers`` that is not a bool; naming ``fragments``, for one that is
            not a positive integer dividing ``sync_every``, or above 1 with
            ``adapt_to_stragglers=True``.
    """

    sync_every: int
    outer_optimizer: keras.optimizers.Optimizer | None = None
    adapt_to_stragglers: bool = False
    fragments: int = 1

    def __post_init__(self) -> None:
        check_positive_int("sync_every", self.sync_every)
        if not isinstance(self.adapt_to_stragglers, bool):
            raise invalid_argument("adapt_to_stragglers", self.adapt_to_stragglers, "True or False")
        self._check_fragments()
        outer = self.outer_optimizer
        if outer is not None and not isinstance(outer, keras.optimizers.Optimizer):
            raise invalid_argument(
                "outer_optimizer",
                outer,
                "a keras.optimizers.Optimizer instance, or None (plain averaging)",
                note="DiLoCo's: keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True).",
            )
        if isinstance(outer, keras.optimizers.LossScaleOptimizer):
            raise invalid_argument(
                "outer_optimizer",
                type(outer).__name__,
                "an optimizer without loss scaling",
                note="The outer gradient is a parameter change, not a scaled loss's gradient.",
            )

    def _check_fragments(self) -> None:
        """``fragments``: a positive int dividing ``sync_every``, 1 when adapting."""
        k, h = check_positive_int("fragments", self.fragments), self.sync_every
        if k > h or h % k:
            raise invalid_argument(
                "fragments",
                k,
                f"a divisor of sync_every={h} (one fragment syncs every sync_every / fragments "
                "updates)",
            )
        if k > 1 and self.adapt_to_stragglers:
            raise invalid_argument(
                "fragments",
                k,
                "1 with adapt_to_stragglers=True",
                note="Its sync weighs each worker by its steps in the round of H updates; "
                "staggered fragments each end their rounds at other updates.",
            )


_EXPECTED = {
    "strategy": "None on this strategy",
    "stragglers": "adapt_to_stragglers=False with the straggler report on",
}


def local_sgd_options(value: Any) -> LocalSGDOptions | None:
    """``Trainer(local_sgd=...)`` checked: None, or a `LocalSGDOptions`."""
    if value is None or isinstance(value, LocalSGDOptions):
        return value
    raise invalid_argument(
        "local_sgd", value, "a tfdist.LocalSGDOptions(sync_every=H, outer_optimizer=...) or None"
    )


def check_local_sgd(
    options: LocalSGDOptions | None, runner: Any, trainer_options: Any, model: keras.Model
) -> None:
    """The refusals of ``local_sgd=``: one clear error each (more ``fragments`` than trainable
    variables, the strategy, sharding, a pipeline, balanced batches, a model's own
    ``train_step``, the straggler report beside ``adapt_to_stragglers`` on several workers).

    Args:
        options: The checked ``local_sgd`` option, or None (nothing to check).
        runner: The strategy's runner (its ``local_sgd_refusal``).
        trainer_options: The Trainer's other options (``exchange``, ``pipeline``, ``balance``,
            ``stragglers``).
        model: The compiled model.
    """
    if options is None:
        return
    variables = len(model.trainable_variables)
    if model.built and options.fragments > max(variables, 1):
        raise too_many(options.fragments, variables)
    reasons = [
        ("strategy", runner.local_sgd_refusal),
        (
            "sharding",
            trainer_options.exchange.sharding is not None
            and "ZeRO keeps one shard of one optimizer state per replica, for parameters that "
            "are the same on every replica; local SGD's replicas each keep their own parameters "
            "and their own whole optimizer state.",
        ),
        (
            "pipeline",
            trainer_options.pipeline is not None
            and "A pipeline's stages (and the hybrid's replicas of them) update one model "
            "together at every update; local SGD's replicas each update their own copy.",
        ),
        (
            "balance",
            trainer_options.balance not in (None, False)
            and "Balanced batches give a slow worker a smaller share of each synchronous "
            "update; under local SGD workers wait for each other only at a sync, and the "
            "averaged parameters weigh every worker alike.",
        ),
        (
            "model",
            Overrides.of(model).train_step
            and f"{type(model).__name__} has its own train_step, which applies its gradients "
            "through Keras's optimizer: Keras all-reduces them at every update.",
        ),
        (
            "stragglers",
            options.adapt_to_stragglers
            and trainer_options.stragglers is not None
            and len(runner.loop_tasks) > 1
            and "adapt_to_stragglers skips a slow worker's updates from the train loop itself; "
            "the straggler report times each update from inside it, where an update cannot be "
            "skipped (Trainer(stragglers=None), tfdist train --stragglers=off).",
        ),
    ]
    for name, reason in reasons:
        if reason:
            raise invalid_argument(
                "local_sgd",
                options,
                _EXPECTED.get(name, f"None with this {name}"),
                note=str(reason),
            )
