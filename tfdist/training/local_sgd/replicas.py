"""Each replica's own local-SGD state in a backup: a resume mid-round continues every replica.

Between syncs each replica's parameters, averaged statistics (BatchNorm's moving mean and
variance) and inner-optimizer slots (momentum, Adam's moments: never averaged) are its own, but a
checkpoint of a mirrored variable holds one value, the chief's first replica's. So a local-SGD
backup also holds, per such variable, a ``[replicas, *shape]`` copy (`ReplicaCopies`):

* **gathered at each save** (`ReplicaCopies.gather`, every worker, before the write): each
  replica's values packed flat, **one all-gather per dtype** (one in float32 training), the
  strategy's own (``strategy.gather``: bytes copied, no arithmetic, so every row is that
  replica's exact bits). The chief writes the rows with the rest of its checkpoint, so the one
  atomic commit of ``state.json`` (`tfdist.training.backup.files`) covers every worker's part;
  no worker writes a file of its own. A save on several replicas is thus a collective: a worker
  lost during one leaves the previous committed backup;
* **mid-round:** every replica's parameters, statistics and slots (``n`` rows each);
* **right after a sync** (the parameters and statistics the same bits everywhere, the model's own
  entries): their copies are empty (``[0, ...]``); the slots still have ``n`` rows (they are
  never averaged, so they differ even then; plain SGD has none but its learning rate);
* **one replica:** no rows at all (the model and optimizer entries are its state).

The resume (`ReplicaCopies.restore`, every worker, right after the checkpoint is read):

* **on the same replica count:** each replica takes its own rows back (worker ``k`` of
  ``multi_worker`` its replica ids' rows), and the run goes on bit for bit as if uninterrupted;
* **on another count (elastic):** the partial round is synced at the resume, as a fit's end does
  (`tfdist.training.local_sgd.sync.LocalState.finish`): the written replicas' parameters
  averaged (DiLoCo: the mean change since the last sync, through the outer optimizer, from the
  backed-up anchors and outer slots) and their statistics averaged, the sync count one more;
  with fragments, every fragment's but one that synced at the backup's very update.
  The inner optimizer's slots are **replica 0's** (the chief's, what the checkpoint's optimizer
  entries hold): a mean of Adam's moments would be a state no replica had. Syncs still fall
  at multiples of ``sync_every``, so the first round after the resume is shorter. A backup
  taken right after a sync resumes on any count with nothing to average.

The rows live in plain (not distributed) variables of each worker, built outside the strategy
scope; after a save they keep the gathered rows until the next one (``n`` times the model and
its slots, on every worker).
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from tfdist.training.local_sgd import fragments

#: The groups of averaged-or-local variables, in the order their rows are gathered.
GROUPS = ("parameters", "statistics", "slots")


class ReplicaCopies:
    """Every replica's copy of each local variable, for a backup; built outside the scope.

    Args:
        state: The local-SGD state (`tfdist.training.local_sgd.sync.LocalState`): its model,
            strategy, parameters, statistics and sync.
    """

    def __init__(self, state: Any) -> None:
        self.state = state
        self.replicas = state.strategy.num_replicas_in_sync
        optimizer = state.model.optimizer
        self.sources = {
            "parameters": list(state.parameters),
            "statistics": list(state.statistics),
            "slots": [v for v in optimizer.variables if tf.as_dtype(v.dtype).is_floating],
        }
        self.copies = {
            group: [_empty_rows(v, f"local_sgd_{group}_{i}") for i, v in enumerate(variables)]
            for group, variables in self.sources.items()
        }
        self._gather_fns: dict[tuple[str, ...], Any] = {}

    def checkpointed(self) -> tf.train.Checkpoint:
        """The rows, as the backup holds them (``parameters``, ``statistics``, ``slots``)."""
        return tf.train.Checkpoint(**self.copies)

    def gather(self) -> None:
        """Every replica's rows into the copies; every worker, eagerly, before a save writes.

        Right after a sync only the slots are gathered (see the module docstring)."""
        if self.replicas == 1:
            return
        groups = ("slots",) if self.state.synced() else GROUPS
        if groups not in self._gather_fns:
            variables = [v for group in groups for v in self.sources[group]]
            strategy = self.state.strategy
            self._gather_fns[groups] = tf.function(lambda: _gathered(strategy, variables))
        with self.state.strategy.scope():
            rows = iter(self._gather_fns[groups]())
        for group in GROUPS:
            for copy in self.copies[group]:
                copy.assign(next(rows) if group in groups else _no_rows(copy))

    def restore(self) -> str:
        """Hands the restored rows out; every worker, eagerly, after the checkpoint is read.

        Returns:
            What it did, for the resume's log: ``""`` (no rows: one replica wrote the backup),
            ``"own"`` (each replica its own rows), ``"averaged"`` (elastic: the partial round
            synced) or ``"slots"`` (elastic right after a sync: replica 0's slots).
        """
        written_on = max((_rows(c) for cs in self.copies.values() for c in cs), default=0)
        mid_round = any(_rows(c) for group in GROUPS[:2] for c in self.copies[group])
        iterations = int(self.state.model.optimizer.iterations.numpy())
        self.state.synced_at = None if mid_round else iterations
        if written_on == 0:
            return ""
        if written_on == self.replicas:
            self._hand_out()
            return "own"
        if not mid_round:
            return "slots"
        self._average(written_on, iterations)
        self.state.synced_at = iterations
        return "averaged"

    def _hand_out(self) -> None:
        """Each local replica's component := its row (by its replica id in the sync group)."""
        strategy = self.state.strategy
        ids = local_replica_ids(strategy)
        for group in GROUPS:
            for copy, v in zip(self.copies[group], self.sources[group]):
                if _rows(copy):
                    for component, replica in zip(
                        strategy.experimental_local_results(v.value), ids
                    ):
                        component.assign(copy[replica])

    def _average(self, written_on: int, iterations: int) -> None:
        """Elastic: the written replicas' rows of the fragments mid-round after ``iterations``
        updates (all but one that synced at that update) averaged and applied as one sync (in
        the scope)."""
        state = self.state
        due = fragments.pending(state.fragments, iterations, state.options.sync_every)
        indices, statistics = state.members(due)
        rows = [self.copies["parameters"][i] for i in indices]
        rows += [self.copies["statistics"][k] for k in statistics]
        anchors = [state.anchors[i] for i in indices] if state.anchors else []

        def sync() -> None:
            averaged = []
            for k, copy in enumerate(rows):
                x = copy.read_value()
                if k < len(anchors):  # DiLoCo: the outer gradient's share
                    x = tf.expand_dims(anchors[k].read_value(), 0) - x
                averaged.append(tf.reduce_sum(x, axis=0) / tf.constant(written_on, x.dtype))
            state.apply(averaged, due)

        with state.strategy.scope():
            tf.function(sync)()


def _empty_rows(variable: Any, name: str) -> tf.Variable:
    """A plain variable of shape ``[None, *variable.shape]``, with no rows yet."""
    shape = tuple(variable.shape)
    if tf.distribute.has_strategy():
        raise RuntimeError("local SGD's replica copies are built outside any strategy scope")
    return tf.Variable(
        tf.zeros((0, *shape), tf.as_dtype(variable.dtype)),
        shape=tf.TensorShape((None, *shape)),
        trainable=False,
        name=name,
    )


def _no_rows(copy: tf.Variable) -> tf.Tensor:
    return tf.zeros((0, *copy.shape[1:]), copy.dtype)


def _rows(copy: tf.Variable) -> int:
    return int(tf.shape(copy)[0])


def local_replica_ids(strategy: tf.distribute.Strategy) -> list[int]:
    """The replica ids in the sync group of this worker's replicas, in their local order."""
    ids: list[int] = []

    def record(context: tf.distribute.experimental.ValueContext) -> tf.Tensor:
        ids.append(context.replica_id_in_sync_group)
        return tf.constant(0)

    strategy.experimental_distribute_values_from_function(record)
    return ids


def _gathered(strategy: tf.distribute.Strategy, variables: list[Any]) -> list[tf.Tensor]:
    """Every replica's value of each variable, ``[replicas, *shape]`` each, the same on every
    worker: one all-gather per dtype of each replica's values packed flat (cross-replica)."""
    n = strategy.num_replicas_in_sync
    copies = [strategy.experimental_local_results(v.value) for v in variables]
    num_local = len(copies[0]) if copies else 1
    by_dtype: dict[tf.DType, list[int]] = {}
    for k, v in enumerate(variables):
        by_dtype.setdefault(tf.as_dtype(v.dtype), []).append(k)
    gathered: list[Any] = [None] * len(variables)
    for indices in by_dtype.values():

        def packed(context: Any, indices: list[int] = indices) -> tf.Tensor:
            i = context.replica_id_in_sync_group % num_local
            with tf.device(copies[indices[0]][i].device):
                flat = [tf.reshape(copies[k][i].read_value(), (1, -1)) for k in indices]
                return tf.concat(flat, axis=1)

        rows = strategy.gather(strategy.experimental_distribute_values_from_function(packed), 0)
        offset = 0
        for k in indices:
            shape = tuple(variables[k].shape)
            size = math.prod(shape)
            gathered[k] = tf.reshape(rows[:, offset : offset + size], (n, *shape))
            offset += size
    return gathered
