"""One update's micro-batches through the pipeline's stages, in the GPipe or 1F1B order.

`Schedule` builds, in the one train ``tf.function``, each stage's forward (``F``) and backward
(``B``) of each micro-batch, in each stage's own order (`stage_order`):

* ``"gpipe"``: every forward, then every backward (in the same order). Nothing orders
  a stage's operations but their data, so TF's dataflow executor runs them as soon as they can;
  every micro-batch's activations are held until its backward: memory ``O(M)``.
* ``"1f1b"`` (PipeDream-flush): stage ``k`` of ``K`` runs ``K-1-k`` forwards, then one forward
  and one backward in turn, then the backwards left. Each of a stage's operations waits for the
  one before it (control dependencies), so a stage holds the activations of at most ``K-k``
  micro-batches: memory ``O(K)``, with the same bubble as GPipe's.

The arithmetic is the same in both orders (each micro-batch's gradients, summed in the same
order), so they give the same weights. Operations are *built* micro-batch by micro-batch, each
stage's forward after the backwards its order puts before it (`_ensure`), so that the loss of a
micro-batch reads the activity losses its own forward made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from keras.utils import unpack_x_y_sample_weight

from tfdist._compat.keras_internals.keras_training import activity_losses
from tfdist._compat.keras_internals.masks import keras_mask
from tfdist.training.step.gradients import add_gradients, dense_part
from tfdist.training.step.objective import Objective, objective, record
from tfdist.training.step.update import batch_size_of, forward

#: The orders `Schedule` builds.
SCHEDULES = ("gpipe", "1f1b")


def stage_order(schedule: str, stage: int, stages: int, micro_batches: int) -> list[tuple]:
    """Stage ``stage``'s operations in order: ``("F", i)`` and ``("B", i)``."""
    m = micro_batches
    if schedule == "gpipe":
        # Backwards in the order their forwards end, as each micro-batch's gradients are added
        # to the sum in this order: a sum waiting on the last micro-batch would hold them all.
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(stages - 1 - stage, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]


@dataclasses.dataclass
class MicroBatch:
    """One micro-batch's forward so far, its loss and its objectives' gradients."""

    x: Any
    y: Any
    sample_weight: Any
    size: tf.Tensor
    records: list[tuple[Any, Any, Any, list]] = dataclasses.field(default_factory=list)
    earlier: list[tf.Tensor] = dataclasses.field(default_factory=list)  # activity losses
    loss: Objective | None = None  # once the last stage's forward ran
    # Per objective: the gradient of the stage's input, and the coefficients of the activity
    # losses of the stages before (``d objective / d loss``), from the backward done so far.
    dh: list[Any] = dataclasses.field(default_factory=list)
    coefficients: list[list[Any]] = dataclasses.field(default_factory=list)
    term_grads: list[list[Any]] = dataclasses.field(default_factory=list)


class Schedule:
    """Builds one update's ``F`` and ``B`` of every stage (replica context).

    Args:
        update: The `tfdist.training.pipeline.update.PipelineUpdate` (model, stages, optimizer,
            loss scaling, ``expected``, ``num_replicas``, ``index``).
        pieces: The micro-batches.
        schedule: ``"gpipe"`` or ``"1f1b"``.
    """

    def __init__(self, update: Any, pieces: Sequence[Any], schedule: str) -> None:
        self.update = update
        self.stages = update.stages
        k, m = len(self.stages), len(pieces)
        self.chain = schedule == "1f1b"
        self.order = [stage_order(schedule, s, k, m) for s in range(k)]
        self.done = [0] * k
        self.last: list[list[Any]] = [[] for _ in range(k)]  # each stage's last outputs
        variables = update.model.trainable_variables
        self.grads: list[Any] = [None] * len(variables)
        self.batches = []
        for piece in pieces:
            x, y, sample_weight = unpack_x_y_sample_weight(piece)
            self.batches.append(MicroBatch(x, y, sample_weight, batch_size_of(x)))

    def build(self) -> list[MicroBatch]:
        """Every operation, micro-batch by micro-batch; returns the micro-batches."""
        for i in range(len(self.batches)):
            for k in range(len(self.stages)):
                self._ensure(k, self.order[k].index(("F", i)))
        for k in range(len(self.stages)):
            self._ensure(k, len(self.order[k]) - 1)
        return self.batches

    def _ensure(self, k: int, position: int) -> None:
        """Builds stage ``k``'s operations up to ``position`` of its order."""
        while self.done[k] <= position:
            kind, i = self.order[k][self.done[k]]
            if kind == "B" and k < len(self.stages) - 1:  # its output gradient first
                self._ensure(k + 1, self.order[k + 1].index(("B", i)))
            after = (
                tf.control_dependencies(self.last[k]) if self.chain else contextlib.nullcontext()
            )
            with after, tf.device(self.stages[k].device):
                made = self._forward(k, self.batches[i]) if kind == "F" else self._backward(k, i)
            self.last[k] = [t for t in made if t is not None]
            self.done[k] += 1

    def _forward(self, k: int, batch: MicroBatch) -> list[Any]:
        """Stage ``k``'s forward of ``batch`` (the loss on the last stage)."""
        stage, last = self.stages[k], k == len(self.stages) - 1
        h = batch.x if k == 0 else batch.records[-1][2]
        # Persistent: a masked term's coefficient and gradients are read from it as well.
        with tf.GradientTape(persistent=True) as tape:
            if k > 0:
                tape.watch([h[i] for i in floating(h)])
            out = stage_forward(stage.model, h, k, training=True)
            if not last:  # what crosses the cut after this stage, as a list
                out = tf.nest.flatten(out)
            # Activity losses made here: the last stage's loss reads them, and gives each its
            # coefficient (``d objective / d loss``) for this stage's backward.
            acts = [] if last else activity_losses(stage.model)
            if last:
                tape.watch(batch.earlier)
                self._loss(batch, out, tape)
        batch.records.append((tape, h if k > 0 else None, out, acts))
        batch.earlier.extend(acts)
        if last:
            data = (batch.x, batch.y, out, batch.sample_weight)
            record(self.update.model, batch.loss, data, batch.size)
        return [*tf.nest.flatten(out), *acts, *(batch.loss.targets if last else [])]

    def _loss(self, batch: MicroBatch, out: Any, tape: tf.GradientTape) -> None:
        """Keras's loss of ``batch`` (under the last stage's ``tape``), normalised as every
        update's (`tfdist.training.step.objective`)."""
        update = self.update
        batch.loss = objective(
            tape,
            update.model,
            update.optimizer,
            (batch.x, batch.y, out, batch.sample_weight),
            batch.size,
            num_replicas=update.num_replicas,
            expected=update.expected,
        )

    def _backward(self, k: int, i: int) -> list[Any]:
        """Stage ``k``'s backward of micro-batch ``i``, every objective; gradients added up."""
        batch = self.batches[i]
        tape, h_in, out, acts = batch.records[k]
        variables = self.update.model.trainable_variables
        objectives = batch.loss.targets
        if k == len(self.stages) - 1:
            batch.term_grads = [[None] * len(variables) for _ in objectives[1:]]
            batch.dh, batch.coefficients = [], []
        made = []
        for o, target in enumerate(objectives):
            into = self.grads if o == 0 else batch.term_grads[o - 1]
            if k == len(self.stages) - 1:
                # Every variable: the others' weight regularisers are part of this loss.
                own, inputs = list(variables), floating(h_in)
                got = tape.gradient(target, own + [h_in[i] for i in inputs] + batch.earlier)
                batch.coefficients.append(got[len(own) + len(inputs) :])
                batch.dh.append(spread(got[len(own) : len(own) + len(inputs)], inputs, h_in))
                got = got[: len(own)]
            else:
                own = self.stages[k].trainable_variables
                got = self._stage_gradient(batch, o, tape, (h_in, out, acts), own)
            for v, g in zip(own, got):
                if g is not None:
                    j = self.update.index[id(v)]
                    into[j] = g if into[j] is None else add_gradients(into[j], g)
                    # The sum: each micro-batch's gradient freed at once.
                    made.append(dense_part(into[j]))
            made.extend(batch.dh[o] or [])
        return made

    def _stage_gradient(
        self, batch: MicroBatch, o: int, tape: Any, io: tuple, own: list[Any]
    ) -> list[Any]:
        """A stage before the last: its variables' gradients of objective ``o``, from the output
        gradient and its activity losses' coefficients; sets the input's (``batch.dh[o]``)."""
        h_in, out, acts = io
        coefficients = batch.coefficients[o]
        cut = len(coefficients) - len(acts)  # this stage's are the last ones
        mine, batch.coefficients[o] = coefficients[cut:], coefficients[:cut]
        targets = list(zip(out, batch.dh[o] or [None] * len(out)))
        targets += [(a, c) for a, c in zip(acts, mine)]
        targets = [(t, g) for t, g in targets if g is not None]
        if not targets:  # neither this stage nor those before reach the loss
            batch.dh[o] = None
            return [None] * len(own)
        inputs = floating(h_in) if h_in is not None else []
        got = tape.gradient(
            [t for t, _ in targets],
            own + [h_in[i] for i in inputs],
            output_gradients=[g for _, g in targets],
        )
        batch.dh[o] = spread(got[len(own) :], inputs, h_in) if h_in is not None else None
        return got[: len(own)]


def stage_forward(model: Any, h: Any, k: int, training: bool) -> Any:
    """Stage ``k``'s outputs on ``h``: the model's inputs (``k == 0``), else what crosses the
    cut before it, with the Keras masks its tensors carry (``Embedding(mask_zero=True)``'s
    output crossing a cut), which a functional model takes only as its ``mask`` argument."""
    masks = [keras_mask(t) for t in h] if k > 0 else []
    if not any(m is not None for m in masks):
        return forward(model, h, training=training)
    with warnings.catch_warnings():
        # Keras warns that a functional model "destroys" the masks it is given; its layers do
        # read them (and set their outputs' own).
        warnings.filterwarnings("ignore", "Layer '.*' \\(of type Functional\\) was passed an input")
        return model(h, training=training, mask=masks)


def floating(h: Sequence[Any]) -> list[int]:
    """The positions in ``h`` (what crosses a cut) of the tensors gradients flow through (a
    mask or token ids do not)."""
    return [i for i, t in enumerate(h) if t.dtype.is_floating]


def spread(grads: Sequence[Any], positions: Sequence[int], h: Sequence[Any]) -> list[Any]:
    """``grads`` of ``h[positions]`` as one gradient (or None) per tensor of ``h``."""
    full: list[Any] = [None] * len(h)
    for i, g in zip(positions, grads):
        full[i] = g
    return full
