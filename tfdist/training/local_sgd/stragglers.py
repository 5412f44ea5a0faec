"""Stragglers under local SGD: a slower worker takes fewer inner steps in a round of ``H``.

``LocalSGDOptions(sync_every=H, adapt_to_stragglers=True)``. Every worker still runs every
loop iteration (calls, epochs and syncs stay in lockstep), but a worker whose measured time per
inner step is ``t`` while the fastest's is ``t_min`` takes an inner update in only ``s =
round(H * t_min / t)`` (at least 1) of the round's ``H`` iterations, and in the others reads
its batches and drops them (no forward, no backward, no optimizer update: only
``optimizer.iterations`` moves, so the syncs stay where they were). Skipped iterations cost
nothing, so the workers reach the sync together, in about the slow worker's time for its ``s``
steps. Its share of a skipped batch is not trained on (the data each worker reads is unchanged;
a slow worker trains on fewer of its examples) and enters no metric. Sparse gradients (an
``Embedding``'s rows) stay rows in the steps taken, as plain local SGD keeps them; a skipped
step's have none (`tfdist.training.local_sgd.update`).

Every decision is a function of values every worker holds bit for bit:

* the **steps** of each replica (``s``, one per replica, the same for a worker's replicas) are
  recomputed at each sync from the **seconds** per inner step each worker measured in the round
  (from the start of its update to its gradients, `tfdist.strategies.step_clock`'s compute
  mark), which travel in the sync's own all-reduce (one more tensor of ``replicas`` floats);
  smoothed (the mean of the previous and the new measurement), a worker within
  ``TOLERANCE`` of the fastest takes all ``H`` (so noise does not cost steps);
* which iterations a worker takes (`takes_step`): spread over the round, Bresenham's way;
* the sync weighs each replica's parameters (DiLoCo: its change) by the steps it took in the
  round over the round's iterations (`weights`): ``sum_i w_i x_i / sum_i w_i``. The fastest
  worker takes every iteration, so with no straggler every weight is exactly 1.0 and the sync
  is today's mean, bit for bit.

The first two rounds take all ``H`` steps everywhere: the first round's measurement is dropped
(on a busy host the first execution's one-time costs made a fast worker look slow).
"""

from __future__ import annotations

import tensorflow as tf

#: A worker within this fraction of the fastest's rate takes every step of its round.
TOLERANCE = 0.1


def takes_step(index: tf.Tensor, steps: tf.Tensor, sync_every: int) -> tf.Tensor:
    """Whether the update at ``index`` (0-based, within its round of ``sync_every``) is one of
    the ``steps`` inner steps a worker takes in it: the first ``j`` updates of a round hold
    ``floor(j * steps / sync_every)`` of them (`taken`), spread evenly."""
    return taken(index + 1, steps, sync_every) > taken(index, steps, sync_every)


def taken(updates: tf.Tensor, steps: tf.Tensor, sync_every: int) -> tf.Tensor:
    """Inner steps taken in the first ``updates`` updates of a round, for ``steps`` a round."""
    updates = tf.cast(updates, tf.int64)
    return tf.math.floordiv(updates * tf.cast(steps, tf.int64), sync_every)


def weights(updates: tf.Tensor, steps: tf.Tensor, sync_every: int, dtype: tf.DType) -> tf.Tensor:
    """Each replica's weight at a sync after ``updates`` updates of a round: the steps it took
    over ``updates`` (exactly 1.0 for a worker that took every one)."""
    took = taken(updates, steps, sync_every)
    return tf.cast(took, dtype) / tf.cast(updates, dtype)


def smoothed(previous: tf.Tensor, measured: tf.Tensor) -> tf.Tensor:
    """Seconds per inner step: the mean of the previous and the new measurement; the new one
    alone where none was kept yet (previous 0), the previous one where nothing was measured
    (0). The first round's measurement is dropped (previous -1, the start: it holds the first
    execution's one-time costs), leaving 0."""
    mean = (previous + measured) / 2
    kept = tf.where(measured > 0, tf.where(previous > 0, mean, measured), previous)
    return tf.where(previous < 0, tf.zeros_like(previous), kept)


def inner_steps(seconds: tf.Tensor, sync_every: int) -> tf.Tensor:
    """Each replica's inner steps in the next round, from its seconds per step: ``H`` for the
    fastest and any within `TOLERANCE` of its rate, else ``round(H * rate)``, at least 1.
    Unknown seconds (0 or less) count as the fastest."""
    known = seconds > 0
    fastest = tf.reduce_min(tf.where(known, seconds, tf.constant(float("inf"), seconds.dtype)))
    rate = tf.where(known, fastest / tf.where(known, seconds, 1), tf.ones_like(seconds))
    scaled = tf.maximum(tf.round(rate * sync_every), 1)
    steps = tf.where(rate >= 1 - TOLERANCE, tf.cast(sync_every, seconds.dtype), scaled)
    return tf.cast(steps, tf.int64)
