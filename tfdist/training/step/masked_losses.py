"""Keras's loss of one replica's batch, with its masked terms weighed by the global valid count.

Keras reduces a masked term (an output's Keras mask, a loss's ``ignore_class``)
with ``"sum_over_batch_size"`` to the sum of its weighted values over the
**valid** count of the batch it sees. Under a strategy each replica divides by its
own count, so averaging the replicas (Keras's ``fit``, or a mean weighted by
examples) is not the mean of one device on the whole batch. Here each masked term
``j`` is taken apart (`split`): Keras's value ``v_j = S_j / (d_j * N)`` gives
the local sum ``S_j`` and count ``d_j``, its loss weight ``c_j`` is ``d loss / d v_j``,
and the rest of the loss (unmasked terms, regularisers) keeps tfdist's weighting by
examples. The replica step (`tfdist.training.step.update`) sums ``S_j``, ``d_j`` and the
gradients of ``c_j * S_j`` over its micro-batches, adds up the counts of all replicas
(``D_j``, and the examples ``T``), and adds ``c_j * grad(S_j) / D_j`` to the update: one
device on the whole batch, exactly (one small all-reduce of the counts per update, for
masked models only). The ``loss`` log and the per-output ``<name>_loss`` logs are weighed
the same way (`update_loss_log`, `masked_means`); so is evaluation
(`log_masked_evaluation`). A ``"mean_with_sample_weight"`` term (divided by its sum
of weights) is taken apart the same way.

Everything else (unmasked terms, sample weights, which Keras's
``"sum_over_batch_size"`` counts whatever their value) is unchanged: a model without a
masked term computes exactly what it did before.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfdist._compat.keras_internals.keras_training import (
    loss_tracker,
    output_loss_trackers,
    recorded_updates,
)
from tfdist._compat.keras_internals.masks import MaskedTerm, masked_terms
from tfdist.training.step.exchange import sum_counts
from tfdist.training.step.model_steps import overridden


def takes_training(method: Callable[..., Any]) -> bool:
    """Whether a ``call()``/``compute_loss()`` takes ``training`` (read at trace time only)."""
    # A user's override may lack it (compute_loss got it in Keras 3.3); Keras probes the same way.
    return "training" in inspect.signature(method).parameters


def compute_loss(
    model: keras.Model, x: Any, y: Any, y_pred: Any, sample_weight: Any, training: bool
) -> tf.Tensor:
    """Keras's compiled loss (+ regularisers) of one replica's batch, over the replica count."""
    if takes_training(model.compute_loss):
        return model.compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training
        )
    return model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)


@dataclasses.dataclass
class ReplicaLoss:
    """One replica's loss as Keras computed it, and what it is made of.

    Attributes:
        loss: Keras's value (local means over the replica count, plus regularisers).
        recorded: ``(tracker, value)`` of each per-output loss log Keras would update.
        terms: The masked mean terms (`MaskedTerm`).
        only_masked: Nothing but the masked terms is in ``loss`` (no unmasked term,
            no regulariser, Keras's own ``compute_loss``).
    """

    loss: tf.Tensor
    recorded: list[tuple[keras.metrics.Metric, tf.Tensor]]
    terms: list[MaskedTerm]
    only_masked: bool


def replica_loss(
    model: keras.Model, data: tuple[Any, Any, Any, Any], training: bool
) -> ReplicaLoss:
    """Keras's loss of ``data = (x, y, y_pred, sample_weight)``, no log updated (replica ctx)."""
    x, y, y_pred, sample_weight = data
    with recorded_updates(output_loss_trackers(model)) as recorded, masked_terms() as record:
        loss = compute_loss(model, x, y, y_pred, sample_weight, training=training)
    only_masked = (
        bool(record.terms)
        and record.calls == len(record.terms)
        and not model.losses
        and not overridden(model, "compute_loss")
    )
    return ReplicaLoss(loss, recorded, record.terms, only_masked)


@dataclasses.dataclass
class Split:
    """A replica loss taken apart (`split`), in replica context.

    Attributes:
        rest: The loss without its masked terms (a mean over the replica count).
        sums: ``S_j``, each masked term's local weighted sum (differentiable).
        counts: ``d_j``, each masked term's local valid count.
        coefficients: ``c_j``, each masked term's weight in the loss.
    """

    rest: tf.Tensor
    sums: list[tf.Tensor]
    counts: list[tf.Tensor]
    coefficients: list[tf.Tensor]

    def weighted(self) -> list[tuple[tf.Tensor, tf.Tensor]]:
        """``(c_j, S_j)`` of each masked term."""
        return list(zip(self.coefficients, self.sums))


def split(tape: tf.GradientTape, replica: ReplicaLoss, num_replicas: int) -> Split:
    """``replica``'s loss as its rest and its masked terms' sums; call it under ``tape``.

    ``tape`` must be persistent (it gives each masked term's coefficient).
    """
    loss = replica.loss
    values = [term.value for term in replica.terms]
    with tape.stop_recording():
        grads = tape.gradient(loss, values, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    coefficients = [tf.stop_gradient(tf.cast(c, loss.dtype)) for c in grads]
    sums = [
        tf.cast(term.value, loss.dtype) * tf.cast(num_replicas * term.count, loss.dtype)
        for term in replica.terms
    ]
    if replica.only_masked:
        rest = tf.zeros_like(loss)
    else:
        rest = loss - tf.add_n([c * tf.cast(v, loss.dtype) for c, v in zip(coefficients, values)])
    counts = [tf.cast(term.count, tf.float32) for term in replica.terms]
    return Split(rest, sums, counts, coefficients)


def output_trackers_of_terms(replica: ReplicaLoss) -> dict[int, int]:
    """``id(tracker) -> j``: the per-output loss log of each masked term, where they pair up.

    Keras's ``CompileLoss`` computes each output's loss, then updates its log, in order;
    so where there are as many masked terms as logs, the ``j``-th of each go together.
    """
    if len(replica.terms) != len(replica.recorded) or len(replica.recorded) < 2:
        return {}
    return {id(tracker): j for j, (tracker, _) in enumerate(replica.recorded)}


def masked_means(
    examples: tf.Tensor, total: tf.Tensor, sums: list[tf.Tensor], global_counts: list[tf.Tensor]
) -> list[tf.Tensor]:
    """Each masked term's log value for a replica that saw ``examples`` of ``total``.

    A ``Mean`` updated on every replica with this value and weight ``examples``
    holds ``sum_j(S) / D_j`` (the sum over all replicas over the global count):
    ``T * S_j / (D_j * examples)``.
    """
    return [
        tf.math.divide_no_nan(total * tf.cast(s, tf.float32), d * examples)
        for s, d in zip(sums, global_counts)
    ]


class MaskedTermsFound(Exception):
    """The first trace of an accumulation loop's body found masked loss terms."""


class MaskedUpdate:
    """One update's masked terms on one replica: their sums, counts and gradients, packed.

    Learned at the first trace (`learn`): ``M`` terms and the present variables'
    sizes. Each micro-batch packs ``[rest log, d (M), S (M), c*S (M), grad(c*S) (M x P)]``
    into one float32 vector (`pack`), which an accumulation loop sums as one loop
    variable whatever ``M`` (an empty vector for a model without masked terms).
    """

    def __init__(self) -> None:
        self.terms = 0
        #: Local SGD: each replica's terms over its own valid counts (no all-reduce).
        self.local = False
        self.shapes: list[tf.TensorShape] = []
        self.trackers: dict[int, int] = {}
        self.recorded: list[keras.metrics.Metric] = []  # the per-output trackers Keras updated

    def learn(self, replica: ReplicaLoss, shapes: list[tf.TensorShape | None]) -> None:
        """Records, at the first trace, the masked terms and the present variables' shapes
        (None: a sparse gradient, whose terms' rows ride in its ``tf.IndexedSlices``)."""
        self.terms = len(replica.terms)
        self.shapes = list(shapes)
        self.trackers = output_trackers_of_terms(replica)
        self.recorded = [tracker for tracker, _ in replica.recorded]

    @property
    def size(self) -> int:
        """Elements of the present variables' dense gradients."""
        return sum(s.num_elements() for s in self.shapes if s is not None)

    @property
    def length(self) -> int:
        """Length of a packed vector (gradients included)."""
        return 1 + 3 * self.terms + self.terms * self.size if self.terms else 0

    def pack(self, parts: Split | None, rest_log: tf.Tensor, grads: list[list[Any]]) -> tf.Tensor:
        """One micro-batch's vector; ``grads[j]``: term ``j``'s gradients of the present ones."""
        if parts is None:
            return tf.zeros([0])
        flat = [tf.reshape(tf.cast(rest_log, tf.float32), [1])]
        flat.append(tf.stack(parts.counts))
        flat.append(tf.cast(tf.stack(parts.sums), tf.float32))
        flat.append(
            tf.cast(tf.stack([c * s for c, s in zip(parts.coefficients, parts.sums)]), tf.float32)
        )
        for term_grads in grads:
            flat.extend(
                tf.reshape(
                    tf.cast(tf.zeros(shape) if g is None else tf.convert_to_tensor(g), tf.float32),
                    [-1],
                )
                for g, shape in zip(term_grads, self.shapes)
                if shape is not None
            )
        return tf.reshape(tf.concat(flat, axis=0), [1 + 3 * self.terms + len(grads) * self.size])

    @staticmethod
    def add(total: tf.Tensor, vector: tf.Tensor) -> tf.Tensor:
        """``total + vector``; an empty ``total`` (the unrolled loop's start) is taken as zeros."""
        if vector.shape[0] == 0:
            return total
        return vector if total.shape[0] == 0 else total + vector

    def unpack(self, vector: tf.Tensor) -> tuple[Any, ...]:
        """``(rest log, counts, sums, weighted sums, gradients per term)`` of a packed vector."""
        m = self.terms
        vector = tf.reshape(vector, [self.length])
        rest_log, counts, sums, weighted = (
            vector[0],
            vector[1 : 1 + m],
            vector[1 + m : 1 + 2 * m],
            vector[1 + 2 * m : 1 + 3 * m],
        )
        shapes = [s for s in self.shapes if s is not None]
        sizes = [s.num_elements() for s in shapes]
        pieces = tf.split(vector[1 + 3 * m :], sizes * m) if sizes else []
        grads = [
            [
                tf.reshape(p, s)
                for p, s in zip(pieces[j * len(sizes) : (j + 1) * len(sizes)], shapes)
            ]
            for j in range(m)
        ]
        return rest_log, tf.unstack(counts), tf.unstack(sums), tf.unstack(weighted), grads

    def combine(
        self,
        model: keras.Model,
        vector: tf.Tensor,
        summed: list[Any],
        count: tf.Tensor,
        *,
        expected: float,
    ) -> tuple[list[Any], dict[int, tf.Tensor]]:
        """``summed`` plus each term's gradients over its global count; updates the ``loss`` log.

        Runs in replica context, before the exchange, with ``count``: this replica's
        examples in the update. One all-reduce of the counts (masked models only), none when
        ``local`` (local SGD: the counts are this replica's, its gradient its own mean).

        Returns:
            The gradient sums to exchange (in ``summed``'s scale: the exchange's
            ``expected / total`` correction turns ``T / (D_j * expected)`` into ``1 / D_j``),
            and the per-output log value of each masked term's tracker, by ``id``.
        """
        rest_log, counts, sums, weighted, grads = self.unpack(vector)
        stacked = tf.stack([count, *counts])
        totals = stacked if self.local else sum_counts(stacked)
        total, global_counts = totals[0], tf.unstack(totals[1:])
        ratios = [tf.math.divide_no_nan(total, d * expected) for d in global_counts]
        dense = [k for k, s in enumerate(summed) if not isinstance(s, tf.IndexedSlices)]
        out = list(summed)
        for term_grads, ratio in zip(grads, ratios):
            for k, g in zip(dense, term_grads):
                out[k] = out[k] + tf.cast(g * ratio, out[k].dtype)
        for k in range(len(out)):
            if k not in dense:
                out[k] = _collapse_term_rows(out[k], ratios)
        update_loss_log(model, rest_log, weighted, global_counts, count, total)
        means = masked_means(count, total, sums, global_counts)
        return out, {tracker: means[j] for tracker, j in self.trackers.items()}


def stack_term_rows(grads: list[Any], term_grads: list[list[Any]], present: list[int]) -> None:
    """In place: each present sparse ``grads[i]`` with its masked terms' rows stacked beside its
    own (values ``[rows, 1 + M, ...]``), and the terms' entries taken out (replica context).

    One lookup's rows of the loss's rest and of each term share their indices (one gather's
    gradient), so the update can weigh each term by its global count (`MaskedUpdate.combine`)
    and add the rows, giving the rows Keras's single gradient has.
    """
    for i in present:
        parts = [grads[i], *(t[i] for t in term_grads)]
        if not any(isinstance(p, tf.IndexedSlices) for p in parts):
            continue
        base = next(p for p in parts if isinstance(p, tf.IndexedSlices))
        values = []
        for p in parts:
            if p is None:
                values.append(tf.zeros_like(base.values))
                continue
            tf.debugging.assert_equal(p.indices, base.indices, "a masked term's rows differ")
            values.append(p.values)
        grads[i] = tf.IndexedSlices(tf.stack(values, axis=1), base.indices, base.dense_shape)
        for t in term_grads:
            t[i] = None


def _collapse_term_rows(rows: tf.IndexedSlices, ratios: list[tf.Tensor]) -> tf.IndexedSlices:
    """`stack_term_rows`' rows as one gradient: the rest's rows plus each term's, weighed."""
    values = rows.values[:, 0]
    for j, ratio in enumerate(ratios):
        values = values + rows.values[:, 1 + j] * tf.cast(ratio, values.dtype)
    return tf.IndexedSlices(values, rows.indices, rows.dense_shape)


def update_loss_log(
    model: keras.Model,
    rest_log: tf.Tensor,
    weighted: list[tf.Tensor],
    global_counts: list[tf.Tensor],
    examples: tf.Tensor,
    total: tf.Tensor,
) -> None:
    """The ``loss`` log of a replica's ``examples`` of ``total``: each masked term over ``D_j``."""
    log = rest_log + tf.add_n(
        [tf.math.divide_no_nan(total * w, d) for w, d in zip(weighted, global_counts)]
    )
    loss_tracker(model).update_state(tf.math.divide_no_nan(log, examples), sample_weight=examples)


def global_size(model: keras.Model, size: tf.Tensor) -> tf.Tensor:
    """This batch's examples on all replicas when the per-output loss logs need it, else ``size``.

    Runs in replica context (in cross-replica context one call sees the whole batch). Only
    evaluation of a model with several compiled losses on several replicas needs it: one
    scalar all-reduce per batch (training reads the count its gradient exchange carries).
    """
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1 or not output_loss_trackers(model):
        return size
    return context.all_reduce(tf.distribute.ReduceOp.SUM, size)


def track_output_losses(
    recorded: list[tuple[keras.metrics.Metric, tf.Tensor]], examples: tf.Tensor, total: tf.Tensor
) -> None:
    """Counts each ``<output>_loss`` mean once per global batch (or update), as Keras does.

    Keras weighs a batch's per-output loss by the batch's static size, unknown for a
    partial batch, so each batch counts once whatever its size. Each replica weighs its
    mean over its ``examples`` by its share of the ``total`` examples on all replicas:
    the sums over the replicas hold the global mean, counted once. Exact for partial
    and empty replica batches.
    """
    share = tf.math.divide_no_nan(examples, total)
    for tracker, mean in recorded:
        tracker.update_state(mean, sample_weight=share)


def log_masked_evaluation(
    model: keras.Model, masked: MaskedUpdate, packed: tf.Tensor, size: tf.Tensor
) -> None:
    """The ``loss`` logs of one evaluation batch with masked terms (replica context)."""
    rest_log, counts, sums, weighted, _ = masked.unpack(packed[: masked.length])
    totals = sum_counts(tf.stack([size, *counts]))
    total, global_counts = totals[0], tf.unstack(totals[1:])
    update_loss_log(model, rest_log, weighted, global_counts, size, total)
    means = masked_means(size, total, sums, global_counts)
    recorded = [
        (tracker, means[masked.trackers[id(tracker)]] if id(tracker) in masked.trackers else mean)
        for tracker, mean in zip(masked.recorded, tf.unstack(packed[masked.length :]))
    ]
    track_output_losses(recorded, size, total)


def output_sums(model: keras.Model, replica: ReplicaLoss, size: tf.Tensor) -> list[tf.Tensor]:
    """Per-output loss sums over this replica's examples, logged once per update.

    One per tracker (zero for one Keras did not update: a compute_loss override).
    """
    means = {id(tracker): mean for tracker, mean in replica.recorded}
    return [tf.cast(means.get(id(t), 0.0), tf.float32) * size for t in output_loss_trackers(model)]
