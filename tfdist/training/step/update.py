"""The replica step, written once and shared by every runner.

A training *update* runs in replica context on ``k`` micro-batches:

1. forward pass (Keras masks kept) and Keras's compiled loss on each micro-batch;
2. the loss is normalised by the **global** batch (``global_batch_size * k``)
   and multiplied by the loss scale (fp16);
3. gradients are summed locally over the ``k`` micro-batches (in a
   ``tf.while_loop`` when the runner drives ``TrainUpdate.cross_replica``, so the
   graph does not grow with ``k``);
4. **one** exchange of the gradients, packed with the example count
   (optionally bucketed and 16-bit, see `tfdist.training.step.exchange`);
5. the gradients are corrected by ``expected / actual`` examples (exactly 1.0
   for full batches, so partial batches are still a true mean);
6. one ``optimizer.apply`` (the loss-scale optimizer unscales and skips
   non-finite updates).

With ``Trainer(accumulation_steps=k)`` the effective batch is
``k * global_batch_size``. ``steps_per_epoch`` still counts micro-batches;
when it is not a multiple of ``k``, the epoch's last few micro-batches make
one smaller update, still normalised by its own examples.
``optimizer.iterations``, learning-rate schedules and the logs' ``updates``
count updates. An optimizer's Keras ``gradient_accumulation_steps`` (which
fails under tf.distribute) is taken over as ``accumulation_steps``.

Masked loss terms (Keras masks, ``ignore_class``) weigh by the valid count of the whole
update (`tfdist.training.step.masked_losses`); gradient helpers: `tfdist.training.step.gradients`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf
from keras.utils import unpack_x_y_sample_weight

from tfdist._compat.keras_internals.keras_training import output_loss_trackers
from tfdist._compat.keras_internals.masks import keras_mask, with_keras_mask
from tfdist.training.step.exchange import all_reduce_sum
from tfdist.training.step.gradients import (
    SparseGradientsFound,
    add_gradients,
    dense_part,
    partitioned_gradients,
    scale_gradient,
)
from tfdist.training.step.masked_losses import (
    MaskedTermsFound,
    MaskedUpdate,
    ReplicaLoss,
    output_sums,
    stack_term_rows,
    takes_training,
    track_output_losses,
)
from tfdist.training.step.objective import objective, record

if TYPE_CHECKING:
    from tfdist.training.options import ExchangeOptions


def batch_size_of(x: Any) -> tf.Tensor:
    first = next(t for t in tf.nest.flatten(x) if t is not None)
    return tf.cast(tf.shape(first)[0], tf.float32)


def forward_never_empty(
    model: keras.Model,
    x: Any,
    size: tf.Tensor,
    *,
    training: bool = True,
    run: Callable[..., Any] | None = None,
) -> Any:
    """Forward pass that never feeds an empty batch to the model (replica context).

    A partial global batch smaller than the replica count leaves some replicas an empty batch,
    which some kernels (oneDNN convolutions) reject. A cond that skips the forward is not safe
    (BatchNormalization in training, or a layer's "sum" counter, updates mirrored variables
    with a merge_call, which TF refuses inside a cond's branch). So an empty batch gets one
    all-zero example (it does enter that replica's BatchNormalization statistics), and the
    predictions, and their Keras masks, are cut back to the real examples: the loss, gradients
    and metrics see only those, as in Keras. ``run(x, training)``: another forward pass (a
    pipeline's stages; default: the model's).
    """
    n = tf.cast(size, tf.int32)

    def one_zero_example(t):
        return None if t is None else tf.zeros(tf.concat([[1], tf.shape(t)[1:]], 0), t.dtype)

    # A cond only picks the input (no side effects in it), so full batches are not copied.
    inputs = tf.cond(n > 0, lambda: x, lambda: tf.nest.map_structure(one_zero_example, x))
    if run is None:
        y_pred = forward(model, inputs, training=training)
    else:
        y_pred = run(inputs, training=training)

    def cut(t):  # an identity slice for full batches
        mask = keras_mask(t)
        return with_keras_mask(t[:n], None if mask is None else mask[:n])

    return tf.nest.map_structure(cut, y_pred)


def forward(model: keras.Model, x: Any, training: bool) -> Any:
    if takes_training(model.call):
        return model(x, training=training)
    return model(x)


#: The accumulation loop's state: gradient sums, examples, per-output loss sums, masked terms
#: (`tfdist.training.zero.update.ShardedUpdate` under ZeRO-2: sums of blocks, and in the last
#: place the count summed over the replicas).
State = tuple[list[tf.Tensor], tf.Tensor, list[tf.Tensor], tf.Tensor]


class TrainUpdate:
    """One optimizer update on ``k`` micro-batches, in replica context (see the module docstring).

    Call it as ``update(micro_batches)`` in replica context (unrolled), or from cross-replica
    context with `cross_replica`: the ``k`` micro-batches in a ``tf.while_loop`` (one forward
    and backward pass in the graph whatever ``k``), for runners that can call ``next`` between
    replica calls. `exchange` and `update` are what sharded optimizer state replaces
    (`tfdist.training.zero.state`).

    Args:
        model: A compiled Keras model (its loss, metrics and loss tracker are used).
        optimizer: The model's optimizer, possibly a ``LossScaleOptimizer``. It must not
            all-reduce again: wrap calls in ``tfdist._compat.gradients_already_summed``.
        global_batch_size: Examples per micro-batch across all replicas.
        accumulation_steps: ``k``, micro-batches per update.
        num_replicas: ``num_replicas_in_sync``.
        skipped_updates: With loss scaling, a counter of updates skipped for non-finite
            gradients (the same decision on every replica: it follows the all-reduce).
        exchange: How the gradients travel (`tfdist.training.options.ExchangeOptions`): its
            ``bucket_bytes`` and ``compression`` (see `tfdist.training.step.exchange`), and
            ``sparse="dense"`` to sum sparse gradients into dense ones before the exchange
            (else their rows are gathered). ``None``: one float32 all-reduce, rows gathered.
    """

    def __init__(
        self,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        *,
        global_batch_size: int,
        accumulation_steps: int,
        num_replicas: int,
        skipped_updates: tf.Variable | None = None,
        exchange: ExchangeOptions | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.accumulation_steps = accumulation_steps
        self.num_replicas = num_replicas
        self.skipped_updates = skipped_updates
        self.bucket_bytes = None if exchange is None else exchange.bucket_bytes
        self.gradient_compression = None if exchange is None else exchange.compression
        self.sparse_as_dense = exchange is not None and exchange.sparse == "dense"
        self.expected = float(global_batch_size * accumulation_steps)
        self.present: list[int] = []  # indices of variables with a gradient (known once traced)
        self.tracked: list[int] = []  # ids of the per-output loss trackers Keras updates
        self.masked = MaskedUpdate()  # the loss's masked terms (known once traced)

    def micro_step(self, data: Any) -> tuple[list[Any], tf.Tensor, list[tf.Tensor], tf.Tensor]:
        """Forward, loss, metrics and local gradients of one micro-batch (replica context).

        Returns the gradients, the batch's example count, its per-output loss sums and
        its masked terms, packed (empty for a model without masked terms).
        """
        model = self.model
        x, y, sample_weight = unpack_x_y_sample_weight(data)
        size = batch_size_of(x)
        # Persistent: a masked term's coefficient and gradient are read from it as well.
        with tf.GradientTape(persistent=True) as tape:
            y_pred = forward_never_empty(model, x, size)
            loss = objective(
                tape,
                model,
                self.optimizer,
                (x, y, y_pred, sample_weight),
                size,
                num_replicas=self.num_replicas,
                expected=self.expected,
            )
        variables = model.trainable_variables
        grads, *term_grads = [partitioned_gradients(tape, t, variables) for t in loss.targets]
        del tape
        record(model, loss, (x, y, y_pred, sample_weight), size)
        if not self.present:
            self._learn(loss.replica, grads, term_grads)
        if term_grads:
            stack_term_rows(grads, term_grads, self.present)
        self.fill_in(grads)
        extra = self.masked.pack(
            loss.parts, loss.rest_log, [[g[i] for i in self.present] for g in term_grads]
        )
        return grads, size, output_sums(model, loss.replica, size), extra

    def fill_in(self, grads: list[Any]) -> None:
        """A zero gradient for each present variable without one (one with only a masked term's
        gradient still has a sum of its own)."""
        variables = self.model.trainable_variables
        for i in self.present:
            if grads[i] is None:
                grads[i] = tf.zeros(variables[i].shape, variables[i].dtype)

    def _learn(self, replica: ReplicaLoss, grads: list[Any], term_grads: list[list[Any]]) -> None:
        """At the first trace: the variables with a gradient, the trackers, the masked terms."""
        variables = self.model.trainable_variables
        self.present.extend(
            i
            for i, g in enumerate(grads)
            if g is not None or any(t[i] is not None for t in term_grads)
        )
        self.tracked.extend(id(tracker) for tracker, _ in replica.recorded)
        sparse = [
            any(isinstance(g[i], tf.IndexedSlices) for g in [grads, *term_grads])
            for i in self.present
        ]
        # A sparse variable's masked terms ride in its rows (`stack_term_rows`), not the pack.
        self.masked.learn(
            replica, [None if s else variables[i].shape for i, s in zip(self.present, sparse)]
        )

    def apply(
        self,
        summed: Sequence[Any],
        count: tf.Tensor,
        output_sums: Any,
        extra: Any,
        total: tf.Tensor | None = None,
    ) -> None:
        """One exchange and one optimizer update; ``summed``: the present variables' sums,
        ``output_sums``: per-output loss sums, ``extra``: masked terms, packed (`micro_step`);
        ``total``: the summed count when ``summed`` was exchanged already (ZeRO-2)."""
        masked_logs: dict[int, tf.Tensor] = {}
        if self.masked.terms:
            summed, masked_logs = self.masked.combine(
                self.model, extra, list(summed), count, expected=self.expected
            )
        if self.sparse_as_dense and total is None:
            summed = [tf.convert_to_tensor(g) for g in summed]
        reduced, total = self.exchange(summed, count) if total is None else (summed, total)
        # An update is one batch of Keras's with a k-times batch: its per-output means count once.
        means = [
            (tracker, masked_logs.get(id(tracker), tf.math.divide_no_nan(s, count)))
            for tracker, s in zip(output_loss_trackers(self.model), output_sums)
            if id(tracker) in self.tracked
        ]
        track_output_losses(means, count, total)
        factor = tf.math.divide_no_nan(tf.constant(self.expected), total)
        scaled = []
        for g in reduced:  # where each gradient is (a pipeline stage's device)
            with tf.device(getattr(g, "device", None) or None):
                scaled.append(scale_gradient(g, factor))
        self.update(scaled)

    def exchange(self, summed: Sequence[Any], count: tf.Tensor) -> tuple[list[Any], tf.Tensor]:
        """The present variables' gradient sums and the example count, summed over replicas.

        A dense sum takes its variable's static shape: a ``Dense`` kernel's gradient on 3-D
        input is ``(None, units)`` as traced, and buckets are sized from static shapes.
        """
        variables = self.model.trainable_variables
        summed = [
            g if isinstance(g, tf.IndexedSlices) else tf.ensure_shape(g, variables[i].shape)
            for g, i in zip(summed, self.present)
        ]
        return all_reduce_sum(
            summed,
            count,
            num_replicas=self.num_replicas,
            bucket_bytes=self.bucket_bytes,
            compression=self.gradient_compression,
        )

    def update(self, grads: Sequence[Any]) -> None:
        """One optimizer update from the present variables' mean gradients."""
        variables = self.model.trainable_variables
        full: list[Any] = [None] * len(variables)
        for i, g in zip(self.present, grads):
            full[i] = g
        if self.skipped_updates is not None:
            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(dense_part(g))) for g in grads])
            self.skipped_updates.assign_add(tf.cast(tf.logical_not(finite), tf.int64))
        self.optimizer.apply(full, variables)

    def __call__(self, micro_batches: Sequence[Any]) -> None:
        """One update on ``micro_batches`` (the loop unrolled), in replica context."""
        self.apply(*self.unrolled(micro_batches))

    def unrolled(self, micro_batches: Sequence[Any]) -> tuple[list[Any], tf.Tensor, Any, Any]:
        """The present variables' gradient sums (a sparse one's rows concatenated), examples,
        per-output loss sums and masked terms of ``micro_batches``, the loop unrolled."""
        summed: list[Any] | None = None
        count = tf.constant(0.0)
        output_sums: list[Any] = []
        extra = tf.zeros([0])
        for data in micro_batches:
            grads, size, losses, packed = self.micro_step(data)
            if summed is None:
                summed = [grads[i] for i in self.present]
                output_sums = losses
            else:
                summed = [add_gradients(a, grads[i]) for a, i in zip(summed, self.present)]
                output_sums = [a + b for a, b in zip(output_sums, losses)]
            count += size
            extra = MaskedUpdate.add(extra, packed)
        return summed, count, output_sums, extra

    def zeros(self) -> State:
        """The accumulation loop's starting state (replica context)."""
        # Every trainable variable gets a sum; those without a gradient stay zero, not applied.
        # The model is built before the step is traced, so its per-output trackers exist.
        # The masked terms are known once the loop body is traced (until then: empty).
        return (
            [tf.zeros(v.shape, v.dtype) for v in self.model.trainable_variables],
            tf.constant(0.0),
            [tf.constant(0.0) for _ in output_loss_trackers(self.model)],
            tf.zeros([self.masked.length]),
        )

    def accumulate(self, data: Any, state: State) -> State:
        """``state`` plus one micro-batch's gradients, examples and loss sums."""
        sums, count, output_sums, extra = state
        grads, size, losses, packed = self.micro_step(data)
        if any(isinstance(g, tf.IndexedSlices) for g in grads):
            raise SparseGradientsFound()  # rows of unknown count: cross_replica unrolls
        if packed.shape[0] != extra.shape[0]:
            raise MaskedTermsFound()  # the loop's state lacks their sums: cross_replica retraces
        return (
            [s if g is None else s + tf.convert_to_tensor(g) for s, g in zip(sums, grads)],
            count + size,
            [a + b for a, b in zip(output_sums, losses)],
            MaskedUpdate.add(extra, packed),
        )

    def finish(self, state: State) -> None:
        """The update from the accumulated ``state``."""
        # Loop outputs carry no device; MWMS places an all-reduce by its inputs' devices, so
        # re-create them here, under the replica's device scope.
        sums, count, output_sums, extra = tf.nest.map_structure(tf.identity, state)
        self.apply([sums[i] for i in self.present], count, output_sums, extra)

    def cross_replica(self, run: Callable[..., Any], next_batch: Callable[[], Any]) -> None:
        """One update from cross-replica context; the micro-batch loop stays symbolic.

        ``run(fn, args)`` runs ``fn`` on every replica (``strategy.run``) and
        ``next_batch()`` gets the next distributed batch.
        """
        if self.accumulation_steps == 1:
            # No loop: the gradients flow straight into the (bucketed) exchange.
            run(self.__call__, ([next_batch()],))
            return

        def body(i, state):
            return i + 1, run(self.accumulate, (next_batch(), state))

        def loop():
            # Starting from zeros, the sums are bit for bit those of the unrolled loop (0 + g == g).
            return tf.while_loop(
                lambda i, _: i < self.accumulation_steps,
                body,
                (tf.constant(0), run(self.zeros, ())),
                parallel_iterations=1,
            )[1]

        try:
            try:
                state = loop()
            except MaskedTermsFound:
                # The first trace of the body found masked terms: the loop again, with their sums.
                state = loop()
        except SparseGradientsFound:
            # Sparse gradients keep every micro-batch's rows (Keras's optimizers treat duplicate
            # rows nonlinearly), a number a loop variable cannot hold: the micro-batches unrolled.
            run(self.__call__, ([next_batch() for _ in range(self.accumulation_steps)],))
            return
        run(self.finish, (state,))
