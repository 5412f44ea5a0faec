"""The synchronisation of local SGD and DiLoCo: what is averaged, in one all-reduce.

`LocalState` is built once, in the strategy scope, after the model and its optimizer. Its
`maybe_sync` runs in **cross-replica** context (a ``merge_call`` from the update, see
`tfdist.training.local_sgd.update`), so that the sync can sit in a ``tf.cond`` on
``optimizer.iterations``: tf.distribute refuses a ``merge_call`` (every all-reduce on CPU is
one) inside a ``tf.cond`` in replica context, but not a collective in cross-replica context.

What one sync does, every replica alike:

1. each replica's copy of each averaged variable is read on its own device
   (``strategy.experimental_local_results``), minus nothing (local SGD) or taken from the
   last synced parameters (DiLoCo: ``anchor - local``, the outer gradient's share);
2. **one** ``batch_reduce_to(SUM)`` of them all, the strategy's own all-reduce (packed into one
   collective on ``multi_worker``; ``ExchangeOptions.bucket_bytes`` becomes its
   ``bytes_per_pack``); DiLoCo's outer gradient in bf16 or fp16 when
   ``ExchangeOptions.compression`` says so (plain averaging stays float32: parameters would lose
   their low bits at every sync);
3. divided by the replica count: every worker gets the same bits, so every replica's copy is
   assigned the same value (bitwise equal after each sync);
4. DiLoCo: the parameters go back to the last synced ones, the outer optimizer applies the
   averaged change as its gradient, and the result is the new anchor.

With ``fragments=K`` (`tfdist.training.local_sgd.fragments`) a sync is of one fragment: steps
1-4 over its parameters and statistics only, with its own copy of the outer optimizer (so an
outer Adam counts that fragment's steps and keeps its slots), one fragment every ``H / K``
updates (a ``tf.cond`` each on ``optimizer.iterations % H``). Its all-reduce carries that
fragment's bytes; the fit's end syncs every fragment mid-round in one all-reduce (all but the
one that synced at that very update). The all-reduce is not overlapped with the next inner
steps, as the paper's is: on CPU each worker's one core would do both.

A fit's end (`LocalState.finish`, before any ``on_train_end``) syncs a partial round: the
model ``fit`` returns is one model. Validation between syncs does not sync (each replica
evaluates its own copy).

Averaged: the trainable variables (through the outer optimizer with DiLoCo) and the model's
floating-point non-trainable weights (BatchNorm's moving mean and variance: a plain mean, never
through the outer optimizer). Local, never exchanged: the inner optimizer's state (its slots,
Adam's moments; its ``iterations`` are the same everywhere), the loss scale under
``mixed_float16``, the metrics' totals (reduced when read, as always) and the random seeds.

A backup (`LocalState.checkpointed`) holds the last synced parameters, the outer optimizers'
variables (every fragment's, in order), the sync count and every replica's own parameters,
statistics and inner slots (`tfdist.training.local_sgd.replicas`): a resume on the same
replica count continues every replica mid-round bit for bit; on another count it syncs the
partial round (elastic resume). With ``fragments=K > 1`` it also holds ``K``: a resume under
another ``fragments`` is refused, naming it, before anything is restored
(`LocalState.check_backup`).

With ``adapt_to_stragglers`` (`tfdist.training.local_sgd.stragglers`) step 1 multiplies each
replica's values by its weight (the steps it took in the round over the round's updates), step
3 divides by the weights' sum instead of the replica count (the same bits when every weight is
1.0), and the all-reduce carries one more tensor: each worker's seconds per inner step, from
which every worker computes the same steps for the next round. A backup also holds those
steps and smoothed seconds.
"""

from __future__ import annotations

import os
from typing import Any

import keras
import tensorflow as tf

from tfdist._compat.keras_internals.optimizer import apply_in_cross_replica_context
from tfdist._compat.keras_internals.scope_moves import optimizer_copy_in_scope
from tfdist.config import invalid_argument
from tfdist.training.local_sgd import fragments, stragglers
from tfdist.training.local_sgd.options import LocalSGDOptions
from tfdist.training.local_sgd.replicas import ReplicaCopies, local_replica_ids

_WIRE_DTYPES = {"bf16": tf.bfloat16, "fp16": tf.float16}


class LocalState:
    """What local SGD keeps beside the model: the last synced parameters and the outer
    optimizer (DiLoCo), and the sync counter; built in ``strategy``'s scope.

    Args:
        model: The built model, its variables in the scope.
        strategy: The strategy.
        options: The ``local_sgd`` option.
        exchange: The Trainer's ``ExchangeOptions`` (``bucket_bytes``, ``compression``).
    """

    def __init__(
        self,
        model: keras.Model,
        strategy: tf.distribute.Strategy,
        options: LocalSGDOptions,
        exchange: Any,
    ) -> None:
        self.model = model
        self.strategy = strategy
        self.options = options
        self.bucket_bytes = exchange.bucket_bytes
        self.compression = exchange.compression
        self.parameters = list(model.trainable_variables)
        self.statistics = [
            v for v in model.non_trainable_weights if tf.as_dtype(v.dtype).is_floating
        ]
        # The compiled end-of-fit syncs, by the fragments they sync.
        self._finish: dict[tuple[int, ...], Any] = {}
        self.fragments = fragments.split(
            model, self.parameters, self.statistics, options.fragments, options.sync_every
        )
        # The updates at which the replicas were last known equal off the H grid (a fit's start
        # or end, an elastic resume): a backup then needs one copy of the parameters.
        self.synced_at: int | None = None
        self.copies: ReplicaCopies | None = None  # each replica's own state, for backups
        with strategy.scope():
            self.syncs = tf.Variable(0, dtype=tf.int64, trainable=False, name="local_sgd_syncs")
            # DiLoCo: a copy of the outer optimizer per fragment, built on its parameters.
            self.outers: list[keras.optimizers.Optimizer] = []
            self.anchors: list[tf.Variable] = []
            if options.outer_optimizer is not None:
                for fragment in self.fragments:
                    outer = optimizer_copy_in_scope(strategy, options.outer_optimizer)
                    outer.build([self.parameters[i] for i in fragment.parameters])
                    self.outers.append(outer)
                self.anchors = [
                    tf.Variable(v.value, trainable=False, name=f"local_sgd_anchor_{i}")
                    for i, v in enumerate(self.parameters)
                ]
            self.adaptive = options.adapt_to_stragglers
            if self.adaptive:
                self._adaptive_state()

    def _adaptive_state(self) -> None:
        """``adapt_to_stragglers``'s variables, in the scope: every replica's steps a round and
        smoothed seconds a step (agreed: the same everywhere), and this worker's own seconds of
        compute in the round and inner steps so far (each worker its own values)."""
        n = self.strategy.num_replicas_in_sync
        h = self.options.sync_every
        self.local_ids = local_replica_ids(self.strategy)
        self.steps = tf.Variable(tf.fill([n], tf.constant(h, tf.int64)), name="local_sgd_steps")
        # -1: the first round's measurement is to be dropped (`stragglers.smoothed`).
        self.seconds = tf.Variable(tf.fill([n], -1.0), trainable=False, name="local_sgd_seconds")
        self.work = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="local_sgd_work")
        self.local_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="local_steps")

    def logs(self) -> dict[str, Any]:
        """The syncs so far and, adapting to stragglers, this worker's inner steps so far."""
        logs: dict[str, Any] = {"syncs": self.syncs}
        if self.adaptive:
            logs["local_steps"] = self.local_steps
        return logs

    def takes_step(self) -> tf.Tensor:
        """Whether this worker takes the coming update (cross-replica; adapting)."""
        h = self.options.sync_every
        index = tf.math.floormod(tf.convert_to_tensor(self.model.optimizer.iterations), h)
        mine = tf.gather(tf.convert_to_tensor(self.steps), self.local_ids[0])
        return stragglers.takes_step(index, mine, h)

    def record_step(self, seconds: tf.Tensor) -> None:
        """An inner step taken, in ``seconds`` of compute (cross-replica; adapting): this
        worker's own counts, written to its copies (no collective: one branch of a cond)."""
        _add_locally(self.strategy, self.work, seconds)
        _add_locally(self.strategy, self.local_steps, tf.constant(1, tf.int64))

    def kept(self, optimizer: keras.optimizers.Optimizer) -> list[tuple[Any, list[tf.Tensor]]]:
        """Each parameter's and inner-optimizer variable's (not ``iterations``) local copies,
        before an update (cross-replica; adapting)."""
        skipped = {id(optimizer.iterations)}
        variables = self.parameters + [v for v in optimizer.variables if id(v) not in skipped]
        kept = []
        for v in variables:
            copies = self.strategy.experimental_local_results(v.value)
            kept.append((copies, [c.read_value() for c in copies]))
        return kept

    def undo_where_skipped(self, take: tf.Tensor, kept: list[tuple[Any, list[tf.Tensor]]]) -> None:
        """A skipping worker's copies put back as `kept` (the update of its zero gradients
        undone: momentum, weight decay); a taking worker's left as they are (cross-replica)."""

        def undo() -> tf.Tensor:
            for copies, values in kept:
                for copy, value in zip(copies, values):
                    copy.assign(value)
            return tf.constant(False)

        tf.cond(take, lambda: tf.constant(True), undo)

    def checkpointed(self) -> tf.train.Checkpoint:
        """What a backup holds of local SGD: the last synced parameters, the outer optimizer's
        variables (its slots and ``iterations``), the sync count (one value each: the same on
        every replica), and every replica's own parameters, statistics and inner slots
        (`tfdist.training.local_sgd.replicas.ReplicaCopies`, built here: call it outside the
        strategy scope). Before each save, ``self.copies.gather()``; after a restore,
        ``self.copies.restore()``, on every worker."""
        if self.copies is None:
            self.copies = ReplicaCopies(self)
        outer = [v.value for o in self.outers for v in o.variables]
        more = {"steps": self.steps, "seconds": self.seconds} if self.adaptive else {}
        if self.options.fragments > 1:  # K, read by `check_backup`; absent: 1 (the old format)
            more["fragments"] = tf.Variable(self.options.fragments, dtype=tf.int64)
        return tf.train.Checkpoint(
            anchors=self.anchors,
            outer=outer,
            syncs=self.syncs,
            replicas=self.copies.checkpointed(),
            **more,
        )

    def check_backup(self, backup: Any) -> None:
        """Refuses a backup written with another ``fragments`` (every worker, before its restore
        reads a value: nothing is lost, the backup still resumes under its own ``fragments``).

        Its fragments' schedule, anchors' rounds and outer optimizers (one per fragment) belong
        to its cut; DiLoCo's outer state would otherwise fail to restore (another count of
        optimizer variables), plain averaging resume on a schedule the backup's rounds never
        had. A backup holds ``K`` when above 1; one without it was written with 1.

        Args:
            backup: The fit's ``tfdist.training.backup.writer.Backup`` (its committed state).

        Raises:
            ValueError: Naming ``fragments``: received, what the backup holds, expected.
        """
        state = backup.read_state()
        if state is None:
            return
        prefix = os.path.join(backup.backup_dir, state["checkpoint"])
        suffix = "local_sgd/fragments/.ATTRIBUTES/VARIABLE_VALUE"
        keys = [k for k, _ in tf.train.list_variables(prefix) if k.endswith(suffix)]
        written = int(tf.train.load_variable(prefix, keys[0])) if keys else 1
        if written != self.options.fragments:
            raise invalid_argument(
                "fragments",
                self.options.fragments,
                f"fragments={written}, what the backup in {backup.backup_dir} holds (its "
                "fragments' rounds and outer optimizer states are cut for that count)",
                note=f"Resume it with LocalSGDOptions(fragments={written}), or start afresh "
                "in another backup_dir.",
            )

    def anchor(self) -> None:
        """The last synced parameters := the parameters (eager, at a fit's start: the previous
        fit ended on a sync, and a model changed between fits starts its round from there)."""
        for anchor, v in zip(self.anchors, self.parameters):
            anchor.assign(v.value)
        self.synced_at = self._iterations()

    def synced(self) -> bool:
        """Whether every replica holds the same parameters and statistics now (eager): after
        the sync of an ``H``-th update, at a fit's start or end, or after an elastic resume."""
        iterations = self._iterations()
        h = self.options.sync_every
        return iterations == self.synced_at or not fragments.pending(self.fragments, iterations, h)

    def _iterations(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def finish(self) -> bool:
        """At a fit's end (eager, every worker): one sync of the partial round when the updates
        are not a multiple of ``sync_every`` (plain averaging, or DiLoCo's outer step on the
        change so far), so the model ``fit`` returns (and the chief saves) is one model, the
        same bits on every replica; with fragments, of every fragment but the one that synced
        at this update, in one all-reduce. Returns whether it synced."""
        due = fragments.pending(self.fragments, self._iterations(), self.options.sync_every)
        if not due:
            return False
        key = tuple(f.index for f in due)
        if key not in self._finish:
            self._finish[key] = tf.function(lambda: self.sync(due))
        with self.strategy.scope():
            self._finish[key]()
        self.synced_at = self._iterations()
        return True

    def maybe_sync(self, strategy: tf.distribute.Strategy, iterations: tf.Tensor) -> tf.Tensor:
        """Syncs the fragment due after ``iterations`` updates, if one is (one fragment: when
        ``iterations`` is a multiple of ``sync_every``; see
        `tfdist.training.local_sgd.fragments` for the schedule); cross-replica context.
        Returns whether it synced."""
        phase = tf.math.floormod(iterations, self.options.sync_every)
        synced = None
        for fragment in self.fragments:

            def sync(fragment: fragments.Fragment = fragment) -> tf.Tensor:
                self.sync([fragment])
                return tf.constant(True)

            due = tf.equal(phase, fragment.offset)
            this = tf.cond(due, sync, lambda: tf.constant(False))
            synced = this if synced is None else tf.logical_or(synced, this)
        return synced

    def sync(self, due: list[fragments.Fragment] | None = None) -> None:
        """One synchronisation (see the module docstring) of the ``due`` fragments (None: all),
        in one all-reduce; cross-replica context."""
        due = self.fragments if due is None else due
        self.apply(self._averaged(due), due)

    def members(self, due: list[fragments.Fragment]) -> tuple[list[int], list[int]]:
        """The indices of the ``due`` fragments' parameters and statistics, in order."""
        return ([i for f in due for i in f.parameters], [k for f in due for k in f.statistics])

    def apply(self, averaged: list[tf.Tensor], due: list[fragments.Fragment]) -> None:
        """A sync's end, given the replicas' means of the ``due`` fragments' parameters
        (DiLoCo: of ``anchor - parameter``) then of their statistics (`members`' order), the
        same bits on every replica; cross-replica. DiLoCo: each fragment's outer optimizer
        applies its own part of the averaged change to its parameters only."""
        indices, statistics = self.members(due)
        n = len(indices)
        for k, mean in zip(statistics, averaged[n:]):
            self.statistics[k].assign(mean)
        if not self.outers:
            for i, mean in zip(indices, averaged[:n]):
                self.parameters[i].assign(mean)
        start = 0
        for fragment in due if self.outers else ():
            size = len(fragment.parameters)
            self._outer_step(fragment, averaged[start : start + size])
            start += size
        self.syncs.assign_add(1)

    def _outer_step(self, fragment: fragments.Fragment, change: list[tf.Tensor]) -> None:
        """DiLoCo: ``fragment``'s parameters back to their anchors, its outer optimizer's step on
        the averaged ``change``, the result the new anchors (cross-replica)."""
        parameters = [self.parameters[i] for i in fragment.parameters]
        anchors = [self.anchors[i] for i in fragment.parameters]
        for v, anchor in zip(parameters, anchors):
            v.assign(anchor)
        apply_in_cross_replica_context(self.outers[fragment.index], change, parameters)
        for v, anchor in zip(parameters, anchors):
            anchor.assign(v.value)

    def _averaged(self, due: list[fragments.Fragment]) -> list[tf.Tensor]:
        """The replicas' mean of each averaged variable of the ``due`` fragments (DiLoCo: of
        ``anchor - parameter``), one tensor each, the same bits on every replica; adapting,
        weighted by the steps taken, and the next round's steps agreed (`_reschedule`)."""
        strategy = self.strategy
        indices, statistics = self.members(due)
        anchored = indices if self.anchors else []
        variables = [self.parameters[i] for i in indices]
        variables += [self.statistics[k] for k in statistics]
        copies = [strategy.experimental_local_results(v.value) for v in variables]
        anchors = [strategy.experimental_local_results(self.anchors[i]) for i in anchored]
        num_local = len(copies[0]) if copies else 1
        # 16 bits on the wire for DiLoCo's outer gradient (a change) only: parameters themselves
        # would lose their low bits at every sync.
        compressed = bool(self.outers) and strategy.num_replicas_in_sync > 1
        wire = _WIRE_DTYPES.get(self.compression) if compressed else None
        weights, updates = (self._weights()) if self.adaptive else (None, None)

        def local_values(i: int, replica: int) -> list[tf.Tensor]:
            values = []
            for k, replicas in enumerate(copies):
                with tf.device(replicas[i].device):
                    x = replicas[i].read_value()
                    if k < len(anchors):  # DiLoCo: the outer gradient's share
                        x = anchors[k][i].read_value() - x
                    if weights is not None:
                        x = x * tf.cast(weights[replica], x.dtype)
                    values.append(x if wire is None else tf.cast(x, wire))
            if weights is not None:
                with tf.device(copies[0][i].device):  # one pack: the variables' device
                    values.append(self._measured(replica, updates))
            return values

        n = strategy.num_replicas_in_sync
        destinations = [v.value for v in variables] + ([self.seconds] if self.adaptive else [])
        if n == 1:
            summed = local_values(0, 0)
        else:
            per_replica = strategy.experimental_distribute_values_from_function(
                lambda ctx: local_values(
                    ctx.replica_id_in_sync_group % num_local, ctx.replica_id_in_sync_group
                )
            )
            options = tf.distribute.experimental.CommunicationOptions(
                bytes_per_pack=self.bucket_bytes or 0
            )
            reduced = strategy.extended.batch_reduce_to(
                tf.distribute.ReduceOp.SUM, list(zip(per_replica, destinations)), options=options
            )
            summed = [strategy.experimental_local_results(r)[0] for r in reduced]
        if weights is not None:
            self._reschedule(summed.pop())
        return [
            tf.cast(s, v.dtype) / _divisor(n, weights, tf.as_dtype(v.dtype))
            for s, v in zip(summed, variables)
        ]

    def _weights(self) -> tuple[tf.Tensor, tf.Tensor]:
        """Each replica's weight at this sync, and the updates of the round it ends."""
        h = self.options.sync_every
        iterations = tf.convert_to_tensor(self.model.optimizer.iterations)
        updates = tf.math.floormod(iterations - 1, h) + 1  # H at a due sync; fewer at a fit's end
        return stragglers.weights(updates, tf.convert_to_tensor(self.steps), h, tf.float32), updates

    def _measured(self, replica: int, updates: tf.Tensor) -> tf.Tensor:
        """This worker's seconds per inner step in the round, at ``replica``'s place in a row of
        zeros (0: no step taken)."""
        h = self.options.sync_every
        took = stragglers.taken(updates, tf.gather(tf.convert_to_tensor(self.steps), replica), h)
        seconds = tf.math.divide_no_nan(tf.convert_to_tensor(self.work), tf.cast(took, tf.float64))
        n = self.strategy.num_replicas_in_sync
        return tf.one_hot(replica, n, dtype=tf.float32) * tf.cast(seconds, tf.float32)

    def _reschedule(self, measured: tf.Tensor) -> None:
        """The next round's steps from every worker's measured seconds a step (the same bits on
        every worker); this worker's round of compute starts again."""
        seconds = stragglers.smoothed(tf.convert_to_tensor(self.seconds), measured)
        self.seconds.assign(seconds)
        self.steps.assign(stragglers.inner_steps(seconds, self.options.sync_every))
        for copy in self.strategy.experimental_local_results(self.work):
            copy.assign(tf.zeros([], tf.float64))


def _divisor(n: int, weights: tf.Tensor | None, dtype: tf.DType) -> tf.Tensor:
    """The replica count, or the weights' sum (``n`` exactly when every weight is 1.0)."""
    if weights is None:
        return tf.constant(n, dtype)
    return tf.cast(tf.reduce_sum(weights), dtype)


def _add_locally(strategy: tf.distribute.Strategy, variable: tf.Variable, value: tf.Tensor) -> None:
    """``value`` added to each of this worker's copies of ``variable`` (no collective)."""
    for copy in strategy.experimental_local_results(variable):
        copy.assign_add(value)
