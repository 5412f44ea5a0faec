"""`LocalUpdate`: the replica step of local SGD, `TrainUpdate` without the gradient exchange.

Each replica's gradients stay its own: `exchange` returns them unreduced with the local example
count, so `TrainUpdate.apply`'s correction ``expected / count`` turns the loss normalised by the
global batch into the mean over this replica's own examples (exactly what one replica training
alone on its batches computes). The inner optimizer then updates this replica's copy only
(tf.distribute updates each replica's component with its own gradient), and a ``merge_call``
hands `tfdist.training.local_sgd.sync.LocalState.maybe_sync` the cross-replica context in which
a sync may run every ``sync_every`` updates.

Masked loss terms (Keras masks, ``ignore_class``) weigh by this replica's own valid counts (no
all-reduce of counts): each replica's gradient is the mean over its own valid terms, as one
replica training alone on its batches computes; the ``loss`` log is each replica's own mean,
weighted by its examples when the replicas' trackers are summed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from tfdist.strategies import step_clock
from tfdist.training.local_sgd.sync import LocalState
from tfdist.training.step.update import TrainUpdate


class LocalUpdate(TrainUpdate):
    """One inner update on this replica's batches, then maybe a sync (replica context).

    Args:
        model: As for `TrainUpdate`.
        optimizer: The inner optimizer.
        state: The local-SGD state (`LocalState`), built in the scope.
        **kwargs: `TrainUpdate`'s other arguments.
    """

    def __init__(
        self,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        *,
        state: LocalState,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, optimizer, **kwargs)
        self.state = state
        self.masked.local = True  # each replica's masked terms over its own valid counts

    def exchange(self, summed: Sequence[Any], count: tf.Tensor) -> tuple[list[Any], tf.Tensor]:
        """No exchange: this replica's gradient sums and example count as they are."""
        step_clock.mark("compute", [list(summed), count])
        return list(summed), count

    def update(self, grads: Sequence[Any]) -> None:
        """The inner optimizer's update of this replica's copy, then the sync when due."""
        super().update(grads)
        iterations = tf.convert_to_tensor(self.optimizer.iterations)
        synced = tf.distribute.get_replica_context().merge_call(
            lambda strategy: self.state.maybe_sync(strategy, iterations)
        )
        # The straggler report's exchange section: the inner update and, at a sync, the wait
        # for the other workers and the all-reduce.
        step_clock.mark("exchange", synced)
