"""A model's forward pass one top-level layer ("unit") at a time on sharded parameters (ZeRO-3),
in replica context: each unit's weights gathered just before it, released after it, gathered
again for its backward, and their gradients reduce-scattered there and then.

Each unit with trainable variables runs inside a ``tf.custom_gradient`` whose inputs are the
unit's tensors and its variables' ``[S]`` blocks (`tfdist.training.zero.layout`):

* forward: every replica's blocks are all-gathered into whole tensors and the unit runs under
  ``keras.StatelessScope(state_mapping=...)`` (its variables read the gathered tensors); the
  whole tensors die with the unit's forward;
* backward, once the upstream gradient exists: the blocks are gathered again, the forward is
  recomputed under a tape, the input gradient is taken first (the gathered weights die), then
  the weight gradients, each summed over the replicas with this replica keeping its block
  (all-reduce of ``[N, S]`` column chunks, then its row); the unit's input gradient waits for
  them, so at most one unit's whole gradients exist at a time. They are the gradients of the
  blocks the unit took as inputs.

What a unit adds beside its outputs is collected inside its scope, where its weights are
whole: its weights' regularizers and its ``add_loss`` terms (activity regularizers), one more
output of the custom gradient; its non-trainable variables' new values (BatchNormalization's
moving statistics, seed states), written after the forward as Keras writes them. A unit with
only non-trainable variables runs under a scope of their whole mirrored values, a layer without
variables under an empty one: their ``add_loss`` terms (``ActivityRegularization``) are collected
there too, so every layer's terms count once. MirroredStrategy traces its replicas in concurrent
threads: what one replica's trace collects is thread-local.

A nested functional or Sequential model (a KerasHub backbone in its task) runs layer by layer
too, each of its layers a unit (`tfdist._compat.keras_internals.unit_calls.call_by_layer`); a
subclassed layer or model is one unit, and so is a subclassed model at the top: its call runs
whole under one scope of all its weights, gathered together, so a replica holds the whole
model's weights during the forward, and again with their whole gradients in the backward
(``replica_bytes["gathered_unit"]`` is all of them); what stays 1/N is what lives between
steps: the weights, the accumulated gradients and the optimizer state. A shared layer (a tied
embedding) is gathered at each use. ``units=`` (`tfdist.training.zero.named_units`) names the
units instead, anywhere in the model, a subclassed one's blocks included: each is intercepted
at its ``call`` and runs as a unit, and the model's other weights are gathered once for the
step on its tape (`Units`).

Keras masks (``Embedding(mask_zero=True)``, ``Masking``, a recurrent layer's) ride between
units as Keras's functional call passes them, on the tensors: a unit's outputs, which the
custom gradient makes anew, carry the masks its layer set on its own outputs, and its backward
recomputes the layer on the same input tensors, masks and all.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from tfdist._compat.keras_internals.layer_graph import layer_graph
from tfdist._compat.keras_internals.masks import keras_mask, with_keras_mask
from tfdist._compat.keras_internals.unit_calls import (
    call_by_layer,
    calls_through,
    losses_as,
    scope_within,
)
from tfdist.training.step.gradients import dense_part
from tfdist.training.step.objective import objective
from tfdist.training.zero.collectives import all_rows
from tfdist.training.zero.layout import shard_size, unblock

#: About how many bytes each all-reduce of a whole gradient's reduce-scatter carries.
CHUNK_BYTES = 8 << 20
#: A layer at a branch (`on_the_tape`) of fewer trainable elements runs on the step's tape.
PLAIN_BELOW = 1 << 16


def _replica_id() -> tf.Tensor:
    return tf.distribute.get_replica_context().replica_id_in_sync_group


def gather_whole(block: tf.Tensor, shape: Any) -> tf.Tensor:
    """The whole tensor of ``shape`` from every replica's ``[S]`` ``block`` (replica context;
    bit for bit: `tfdist.training.zero.collectives.all_rows`)."""
    n = tf.distribute.get_replica_context().num_replicas_in_sync
    return unblock(all_rows(block, n), shape)


def reduce_scatter_one(whole: tf.Tensor, num_replicas: int) -> tf.Tensor:
    """``whole`` summed over the replicas, this replica keeping its ``[S]`` block; in column
    chunks of about `CHUNK_BYTES` (``[N, c]``), one all-reduce each, one after the other."""
    ctx, n = tf.distribute.get_replica_context(), num_replicas
    flat = tf.reshape(whole, [-1])
    size = flat.shape.num_elements()
    width = shard_size(size, n)
    rows = tf.reshape(
        tf.pad(flat, [[0, n * width - size]]) if size < n * width else flat, [n, width]
    )
    step = max(1, CHUNK_BYTES // (n * whole.dtype.size))
    pieces: list[tf.Tensor] = []
    for start in range(0, width, step):
        with tf.control_dependencies(pieces[-1:]):
            chunk = tf.identity(rows if step >= width else rows[:, start : start + step])
        summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, chunk)
        pieces.append(tf.gather(summed, _replica_id()))  # a copy: the summed [N, c] dies here
    return pieces[0] if len(pieces) == 1 else tf.concat(pieces, 0)


def _is_float(tensor: Any) -> bool:
    return keras.backend.is_float_dtype(tensor.dtype)


def on_the_tape(model: keras.Model, below: int = PLAIN_BELOW) -> frozenset[int]:
    """``id``s of the layers of ``model``'s graph that read a float tensor which another layer
    (or the model's output) reads too, a branch of the graph, and have fewer than ``below``
    trainable elements: a pre-norm transformer's ``LayerNormalization`` beside its residual.

    The gradient of a tensor read by several ops is the sum of their contributions, which a
    tape adds in one go. A unit's custom gradient sums the contributions of its own ops first
    and hands the tape that one sum: a ``LayerNormalization`` reads its input three times (the
    mean, the variance, the normalisation), so ``r + (a + b + c)`` where the whole model's
    tape adds ``((r + a) + b) + c``, a rounding apart (Adam magnified it to 2.3e-6 on the
    memory bench's GPT). Such a layer runs on the step's tape instead (`Units`), so the
    contributions meet as in the whole model's backward; a large one stays a unit (its whole
    weights would live from the forward to the backward), a rounding apart. A layer that reads
    the tensor once adds one contribution either way; nested models that the graph does not
    flatten are not looked into."""
    graph = layer_graph(model)
    if graph is None:
        return frozenset()
    readers: dict[int, int] = {}
    for tensor in keras.tree.flatten(graph.outputs):
        key = id(graph.canonical(tensor))
        readers[key] = readers.get(key, 0) + 1
    for step in graph.steps:
        for key in {id(t) for t in step.consumes}:
            readers[key] = readers.get(key, 0) + 1
    found = set()
    for step in graph.steps:
        op = step.operation
        size = sum(int(v.shape.num_elements()) for v in getattr(op, "trainable_variables", []))
        branch = any(_is_float(t) and readers[id(t)] > 1 for t in step.consumes)
        if isinstance(op, keras.layers.Layer) and branch and 0 < size < below:
            found.add(id(op))
    return frozenset(found)


class Units:
    """The unit-by-unit forward pass of ``model`` on the blocks of its trainable variables.

    Args:
        model: A built model (functional or Sequential: unit by unit; subclassed: one unit);
            its trainable variables have no storage (`tfdist.training.zero.parameters`).
        num_replicas: ``num_replicas_in_sync``.
        kept: ``id``s of the trainable variables kept whole and mirrored (small ones,
            `tfdist.training.zero.parameters`): ``blocks[i]`` is their whole value, never
            gathered, and their gradient leaves the backward as this replica's own, summed
            over the replicas by the update's exchange.

    A layer of `on_the_tape` (small, at a branch) runs on the step's tape, not as a unit: its
    weights gathered by a gather whose gradient is their reduce-scatter (`_whole_on_tape`),
    alive until its backward, not recomputed.

    ``named``: the layers ``units=`` names (`tfdist.training.zero.named_units`), found anywhere
    in the model. Given, they alone are units, each intercepted at its ``call`` wherever it runs
    (inside a subclassed model's opaque ``call`` too); the model runs as Keras runs it, under one
    scope that maps every other trainable weight to its whole value, gathered once for the step
    on the step's tape (`_whole_on_tape`), and every other non-trainable one to its value.

    Call `forward` in replica context, under the tape that takes the blocks' gradients; then
    `loss_terms` (the units' regularizers and ``add_loss`` terms) and `write_updates`.
    """

    def __init__(
        self,
        model: keras.Model,
        num_replicas: int,
        *,
        kept: frozenset[int] = frozenset(),
        named: Sequence[Any] = (),
    ) -> None:
        self.model = model
        self.num_replicas = num_replicas
        self.kept = kept
        self.named = list(named)
        self.variables = list(model.trainable_variables)
        self.index = {id(v): i for i, v in enumerate(self.variables)}
        self.plain = on_the_tape(model)
        self._local = threading.local()  # one replica's trace state (see the module docstring)

    def forward(self, x: Any, blocks: Sequence[tf.Tensor], *, training: bool) -> Any:
        """The model's outputs on ``x``; ``blocks[i]``: this replica's block of variable ``i``."""
        self._local.updates = []  # (non-trainable variable, new value)
        self._local.terms = []  # the units' loss terms
        if self.named:
            return self._forward_named(x, blocks, training=training)
        return call_by_layer(
            self.model, x, lambda op, ctx: self._wrapped(op, ctx, blocks), training=training
        )

    def loss_terms(self) -> list[tf.Tensor]:
        """The units' regularizers and ``add_loss`` terms of the last `forward` (float32)."""
        return list(self._local.terms)

    def write_updates(self) -> None:
        """The units' non-trainable variables take their new values, as Keras assigns them in
        replica context (BatchNormalization's moving statistics: each replica its own). A
        variable whose aggregation is ``"sum"`` (a counter's ``assign_add``) takes the change
        instead: its replicas' changes are summed, where new values written whole would be."""
        for variable, value in self._local.updates:
            if variable.aggregation == "sum":
                variable.assign_add(value - tf.convert_to_tensor(variable.value))
            else:
                variable.assign(value)

    def _wrapped(self, op: Any, ctx: dict[str, Any], blocks: Sequence[tf.Tensor]) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            kwargs.update(ctx)
            cut = any(id(v) not in self.kept for v in op.trainable_variables)
            if cut and id(op) not in self.plain:
                return self._unit(op, args, kwargs, blocks)
            # Its ``add_loss`` terms collected in this thread's scope (the layer's own list is
            # shared by the replicas' threads; ``model.losses`` is the units' terms). Its
            # weights whole under the step's tape (kept ones as they are), no recompute.
            ins = [t for t in tf.nest.flatten((args, kwargs)) if tf.is_tensor(t)]
            mapping = [
                (v, self._whole_on_tape(v, blocks[self.index[id(v)]], ins))
                for v in op.trainable_variables
            ]
            mapping += [(v, tf.convert_to_tensor(v.value)) for v in op.non_trainable_variables]
            with keras.StatelessScope(state_mapping=mapping, collect_losses=True) as scope:
                out = op(*args, **kwargs)
                terms = list(scope.losses) + [
                    v.regularizer(v) for v in op.trainable_variables if v.regularizer is not None
                ]
            self._collect(scope, op)
            self._local.terms.extend(tf.cast(t, tf.float32) for t in terms)
            return out

        return call

    def _whole_on_tape(self, variable: Any, block: tf.Tensor, after: list) -> tf.Tensor:
        """``variable``'s whole value from its ``block`` (gathered once ``after`` exists), its
        gradient this replica's block of the sum over the replicas (`_blocks_of`)."""
        if id(variable) in self.kept:
            return block
        with tf.control_dependencies(after):
            block = tf.identity(block)  # a data edge: the gather is built in a merge_call

        @tf.custom_gradient
        def gather(b: tf.Tensor) -> Any:
            def grad(d: Any) -> Any:
                d = d if isinstance(d, tf.IndexedSlices) else tf.ensure_shape(d, variable.shape)
                return self._blocks_of([variable], [d])[0]

            return gather_whole(b, variable.shape), grad

        return gather(block)

    def _collect(self, scope: Any, op: Any) -> None:
        for variable in op.non_trainable_variables:
            value = scope.get_current_value(variable)
            if value is not None:
                self._local.updates.append((variable, value))

    def _run(
        self, op: Any, call: tuple, wholes: list, fixed: list, fn: Any = None
    ) -> tuple[Any, Any, list]:
        """``op`` called as ``call`` (``(args, kwargs)``) under a scope of its weights
        (``wholes``, then ``fixed``: its non-trainable values): its outputs, the scope, and the
        flat outputs with its loss terms summed as one more (float32), if it has any. ``fn``:
        what runs instead of ``op`` (a named unit's own ``call``), under a scope that maps the
        enclosing one's variables too."""
        args, kwargs = call
        mapping = list(zip(op.trainable_variables, wholes)) + fixed
        scope_of = keras.StatelessScope if fn is None else scope_within
        with scope_of(state_mapping=mapping, collect_losses=True) as scope:
            out = (fn or op)(*args, **kwargs)
            terms = list(scope.losses) + [
                v.regularizer(v) for v in op.trainable_variables if v.regularizer is not None
            ]
        flat = tf.nest.flatten(out)
        if terms:
            flat.append(tf.add_n([tf.cast(t, tf.float32) for t in terms]))
        return out, scope, flat

    def _gathered(self, op: Any, blocks: list, after: list) -> list[tf.Tensor]:
        with tf.control_dependencies([t for t in after if t is not None]):
            # A data edge to the collective (MirroredStrategy builds it in a merge_call, on
            # another thread, out of this thread's control scope).
            gated = [tf.identity(b) for b in blocks]
        return [
            b if id(v) in self.kept else gather_whole(b, v.shape)
            for b, v in zip(gated, op.trainable_variables)
        ]

    def _unit(
        self, op: Any, args: tuple, kwargs: dict, blocks: Sequence[tf.Tensor], fn: Any = None
    ) -> Any:
        """``op`` as one unit (see the module docstring); ``fn``: its own ``call`` (`_run`)."""
        fixed = [(v, tf.convert_to_tensor(v.value)) for v in op.non_trainable_variables]
        structure = (args, kwargs)
        flat_in = tf.nest.flatten(structure)
        # Each tensor once (a layer called as ``mha(h, h)``): its gradient is the sum over
        # its uses, which a tape gives it once.
        ins = list({id(t): t for t in flat_in if tf.is_tensor(t)}.values())
        slot = {id(t): k for k, t in enumerate(ins)}
        where = [(i, slot[id(t)]) for i, t in enumerate(flat_in) if tf.is_tensor(t)]
        mine = [blocks[self.index[id(v)]] for v in op.trainable_variables]
        held: dict[str, Any] = {}
        # A layer may clear its inputs' masks in its call (MultiHeadAttention does, as Keras
        # runs it): its recompute in the backward sees them as its first call did.
        masks = [keras_mask(t) for t in ins]

        def call_with(inputs: list) -> tuple:
            for tensor, mask in zip(inputs, masks):
                with_keras_mask(tensor, mask)
            full = list(flat_in)
            for i, k in where:
                full[i] = inputs[k]
            return tf.nest.pack_sequence_as(structure, full)

        @tf.custom_gradient
        def unit(*tensors: tf.Tensor) -> Any:
            inputs = list(tensors[: len(ins)])
            out, scope, flat = self._run(
                op, call_with(inputs), self._gathered(op, mine, ins), fixed, fn
            )
            held.update(scope=scope, structure=out, extra=len(flat) > len(tf.nest.flatten(out)))

            def grad(*upstream: tf.Tensor, variables: Any = None) -> Any:
                got = self._backward(op, (call_with, inputs, mine, fixed, fn), list(upstream))
                return (got, [None] * len(variables)) if variables else got

            return flat, grad

        flat_out = unit(*ins, *mine)
        self._collect(held["scope"], op)
        if held["extra"]:
            self._local.terms.append(flat_out[-1])
            flat_out = flat_out[:-1]
        return tf.nest.pack_sequence_as(held["structure"], _masked_as(held["structure"], flat_out))

    def _forward_named(self, x: Any, blocks: Sequence[tf.Tensor], *, training: bool) -> Any:
        """The model called as Keras calls it, its `named` units intercepted (`_through_unit`),
        every other weight mapped whole, gathered on the step's tape (the class docstring)."""
        inside = {  # the weights of the named units that run as units (some weight cut)
            id(v)
            for layer in self.named
            if any(id(w) not in self.kept for w in layer.trainable_variables)
            for v in layer.variables
        }
        ins = [t for t in tf.nest.flatten(x) if tf.is_tensor(t)]
        rest = [v for v in self.variables if id(v) not in inside or id(v) in self.kept]
        mapping = [(v, self._whole_on_tape(v, blocks[self.index[id(v)]], ins)) for v in rest]
        fixed = [v for v in self.model.non_trainable_variables if id(v) not in inside]
        mapping += [(v, tf.convert_to_tensor(v.value)) for v in fixed]
        self._local.blocks = blocks
        try:
            with calls_through(self.named, self._through_unit):
                with keras.StatelessScope(state_mapping=mapping, collect_losses=True) as scope:
                    out = self.model(x, training=training)
                    terms = list(scope.losses) + [
                        v.regularizer(v)
                        for v in rest
                        if v.regularizer is not None and id(v) not in inside
                    ]
        finally:
            self._local.blocks = None
        for variable in fixed:
            value = scope.get_current_value(variable)
            if value is not None:
                self._local.updates.append((variable, value))
        self._local.terms.extend(tf.cast(t, tf.float32) for t in terms)
        return out

    def _through_unit(self, op: Any, fn: Any, args: tuple, kwargs: dict) -> Any:
        """A named unit ``op``'s ``call`` (``fn``) inside this thread's `_forward_named`: run as
        a unit (`_unit`); elsewhere (another thread's trace done, the unit's own recompute, a
        unit whose weights are all kept) as it is."""
        blocks = getattr(self._local, "blocks", None)
        if blocks is None or all(id(v) in self.kept for v in op.trainable_variables):
            return fn(*args, **kwargs)
        self._local.blocks = None  # inside the unit: its own call is plain
        try:
            return self._unit(op, args, kwargs, blocks, fn)
        finally:
            self._local.blocks = blocks

    def _blocks_of(self, variables: list, grads: list) -> list:
        """Each of ``variables``' weight gradients ``grads`` summed over the replicas, this replica
        keeping its block (a ``tf.IndexedSlices`` one summed into a dense one first)."""
        return [reduce_scatter_one(tf.convert_to_tensor(g), self.num_replicas) for g in grads]

    def _reduced(self, op: Any, grads: list) -> list:
        """`_blocks_of` ``op``'s weight gradients ``grads``; a kept variable's stays this
        replica's own (summed with the update's example count, `kept`)."""
        variables = op.trainable_variables
        cut = [k for k, v in enumerate(variables) if id(v) not in self.kept]
        out = list(grads)
        for k, b in zip(cut, self._blocks_of([variables[k] for k in cut], [grads[k] for k in cut])):
            out[k] = b
        return out

    def _backward(self, op: Any, saved: tuple, upstream: list) -> list:
        """The unit's gradients: its inputs' (None for a non-float one), then its blocks'."""
        call_with, inputs, mine, fixed, fn = saved
        sources = [t for t in inputs if t.dtype.is_floating]
        wholes = self._gathered(op, mine, upstream)  # once the upstream gradient exists
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(sources + wholes)
            _, _, again = self._run(op, call_with(inputs), wholes, fixed, fn)
        zero = tf.UnconnectedGradients.ZERO
        # The input gradient first (it needs the weights), then the weights' (the inputs'):
        # the gathered weights die in between.
        d_in = (
            tape.gradient(again, sources, upstream, unconnected_gradients=zero) if sources else []
        )
        with tf.control_dependencies(d_in):
            later = [tf.identity(d) for d in upstream]
        d_whole = tape.gradient(again, wholes, later, unconnected_gradients=zero)
        # Static shapes (a Dense kernel's gradient on 3-D input is traced as (None, units)).
        d_whole = [
            g if isinstance(g, tf.IndexedSlices) else tf.ensure_shape(g, w.shape)
            for g, w in zip(d_whole, wholes)
        ]
        d_blocks = self._reduced(op, d_whole)
        # One unit's whole gradients at a time.
        with tf.control_dependencies([dense_part(b) for b in d_blocks]):
            d_in = [tf.identity(g) for g in d_in]
        it = iter(d_in)
        return [next(it) if t.dtype.is_floating else None for t in inputs] + d_blocks


def _masked_as(structure: Any, flat_out: list) -> list:
    """``flat_out`` (a custom gradient's outputs, new tensors) carrying the Keras masks of the
    unit's own outputs (``structure``), which the next layers read as Keras's call passes them.
    A mask is made from the unit's inputs, not its weights: no gradient goes through one (a
    float mask's is stopped; Keras's are boolean)."""
    masks = [keras_mask(t) for t in tf.nest.flatten(structure)]
    return [
        with_keras_mask(t, tf.stop_gradient(m) if m is not None and m.dtype.is_floating else m)
        for t, m in zip(flat_out, masks, strict=True)
    ]


def forward_never_empty(units: Units, x: Any, inputs: list, *, training: bool) -> Any:
    """``units.forward`` on ``x``; an empty replica batch runs one all-zero example instead
    (every replica takes part in every unit's gather and reduce-scatter), whose outputs, and
    their Keras masks, are cut away, as the plain step does (`tfdist.training.step.update`)."""
    size = tf.cast(tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0], tf.int32)

    def one_zero_example(t: Any) -> Any:
        return None if t is None else tf.zeros(tf.concat([[1], tf.shape(t)[1:]], 0), t.dtype)

    def cut(t: Any) -> Any:  # an identity slice for full batches
        mask = keras_mask(t)
        return with_keras_mask(t[:size], None if mask is None else mask[:size])

    inputs_x = tf.cond(size > 0, lambda: x, lambda: tf.nest.map_structure(one_zero_example, x))
    y_pred = units.forward(inputs_x, inputs, training=training)
    return tf.nest.map_structure(cut, y_pred)


def forward_and_objective(units: Units, update: Any, data: tuple, inputs: list, tape: Any) -> Any:
    """The training forward unit by unit on ``inputs`` (blocks, or stand-ins for them) and the
    Trainer's objective of ``update`` (a `tfdist.training.step.update.TrainUpdate`) under
    ``tape``, the units' loss terms (regularizers, ``add_loss``) read as ``model.losses``.

    Args:
        data: ``(x, y, sample_weight, size)`` of one micro-batch.

    Returns:
        ``(y_pred, loss)``: the predictions and `tfdist.training.step.objective.objective`'s.
    """
    x, y, sample_weight, size = data
    y_pred = forward_never_empty(units, x, inputs, training=True)
    with losses_as(update.model, units.loss_terms()):
        loss = objective(
            tape,
            update.model,
            update.optimizer,
            (x, y, y_pred, sample_weight),
            size,
            num_replicas=update.num_replicas,
            expected=update.expected,
        )
    return y_pred, loss
