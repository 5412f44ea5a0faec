"""Normalises what ``Trainer.fit`` receives into one `InputSource`.

Accepted forms:
  * a `tfdist.data.DatasetFn` (from ``tfdist.data.load``), bound here to
    the global batch size;
  * any ``dataset_fn(input_context)`` callable returning per-replica batches;
  * a ``tf.data.Dataset`` of **global** batches;
  * a Python generator of global batches or a ``keras.utils.PyDataset``
    (`tfdist.data.python_inputs`);
  * a tuple ``(x,)``, ``(x, y)`` or ``(x, y, sample_weight)`` of arrays, each an array
    or a nested structure of them (a dict or list per input or output), as
    ``Trainer.fit(x, y, sample_weight=...)`` packs them.

``global_batch_size`` travels one way: ``Trainer.fit`` → here → the dataset_fn's
``input_context.get_per_replica_batch_size``. Nothing else recomputes it. When
it is not given for a dataset_fn, it is read off the first per-replica batch
times the replicas in sync: the replica step counts the examples it really
sees, so nothing numerical depends on it (only learning-rate scaling and logs).

Steps: a pass over a user's dataset_fn is ``ceil(batches / replicas_per_pipeline)``
global steps, so the last, partial step is not dropped (the distributed
iterator hands the replicas without a batch an empty one).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist.config import invalid_argument
from tfdist.data.batch_size import read_batch_size
from tfdist.data.batch_sizes import check_global_batch_size, replicas_per_pipeline
from tfdist.data.dataset_fn import DatasetFn
from tfdist.data.python_inputs import EpochHooks, is_python_input, python_dataset

logger = logging.getLogger(__name__)
DEFAULT_GLOBAL_BATCH_SIZE = 32


@dataclasses.dataclass(frozen=True)
class InputSource:
    """Data in a form every runner can distribute.

    Exactly one of ``dataset_fn`` (per-replica batches) or ``dataset`` (global
    batches) is set. ``element_spec`` describes one batch (its batch dimension
    may be ``None``); ``steps_per_epoch`` is the number of global batches in
    one pass, or ``None`` when unknown. ``exact``: every input pipeline yields
    exactly ``steps_per_epoch`` batches per replica in one pass (tfdist's own
    training ``DatasetFn``), so no pipeline can run dry before the others.
    ``in_process``: the batches come from Python code in this process (a generator or a
    ``PyDataset``), so no other process can read them. ``epoch_hooks``: a ``PyDataset``'s
    ``on_epoch_begin``/``on_epoch_end``, for the loop when an epoch is not one pass.
    """

    global_batch_size: int
    element_spec: Any
    steps_per_epoch: int | None
    dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset] | None = None
    dataset: tf.data.Dataset | None = None
    exact: bool = False
    in_process: bool = False
    epoch_hooks: EpochHooks | None = None

    def for_epoch(self, epoch: int) -> InputSource:
        """The source for one epoch: a DatasetFn is reseeded with ``seed + epoch``.

        Each epoch's order then depends on the epoch alone, not on how many
        passes this process made before, so a restarted run sees the same data.
        """
        if self.dataset_fn is None:
            return self
        return dataclasses.replace(self, dataset_fn=_reseeded(self.dataset_fn, epoch))

    def mapped(self, fn: Callable[..., Any], element_spec: Any) -> InputSource:
        """Every batch through ``fn(*batch)`` (e.g. class weights), before it is distributed."""
        if self.dataset is not None:
            return dataclasses.replace(
                self, dataset=self.dataset.map(fn), element_spec=element_spec
            )
        return dataclasses.replace(
            self, dataset_fn=_Map(self.dataset_fn, fn), element_spec=element_spec
        )

    def repeated(self) -> InputSource:
        """Repeated without end (``fit`` with ``steps_per_epoch`` reads across passes).

        A `DatasetFn` is prefetched after the repeat as well (`_Repeat`), so a new pass's
        first batch is ready when the step asks for it.
        """
        if self.dataset is not None:
            return dataclasses.replace(self, dataset=self.dataset.repeat())
        return dataclasses.replace(self, dataset_fn=_Repeat(self.dataset_fn))

    def skipping(self, num_steps: int) -> InputSource:
        """The source without its first ``num_steps`` global batches (resuming mid-epoch).

        Skipping happens inside tf.data, before the data is distributed: each
        pipeline drops its own per-replica batches of those steps, so resuming
        costs no distributed ``next()`` calls.
        """
        if not num_steps:
            return self
        if self.dataset is not None:
            return dataclasses.replace(self, dataset=self.dataset.skip(num_steps))
        return dataclasses.replace(self, dataset_fn=_Skip(self.dataset_fn, num_steps))

    def spare_iterator(self, *, epochs_before: int) -> None:
        """Makes and drops one iterator over a dataset where Keras's ``fit`` makes an unused one.

        Keras's ``EpochIterator`` makes one when a pass ends (for a fit with ``steps_per_epoch``)
        and, without ``steps_per_epoch``, another when the next epoch begins: ``model.fit`` reads
        passes 1, 3, 5, ... (unknown length: 1, 2, 4, 6, ...). Each iterator of a reshuffling
        dataset draws its next order, so a seeded ``shuffle`` gives Keras's epochs only if the
        Trainer draws as many. Nothing is read (tf.data reads on the first ``next``).
        """
        known_length = self.steps_per_epoch is not None
        if self.dataset is not None and epochs_before >= (1 if known_length else 2):
            iter(self.dataset)


def _reseeded(dataset_fn: Any, epoch: int) -> Any:
    """A DatasetFn reseeded with ``seed + epoch`` (also inside a `_Map`); others as given."""
    if isinstance(dataset_fn, DatasetFn):
        return dataset_fn.bind(
            global_batch_size=dataset_fn.global_batch_size, seed=dataset_fn.seed + epoch
        )
    if isinstance(dataset_fn, _Map):
        return _Map(_reseeded(dataset_fn.dataset_fn, epoch), dataset_fn.fn)
    return dataset_fn


@dataclasses.dataclass(frozen=True)
class _Map:
    """``dataset_fn`` wrapper: each pipeline's batches go through ``fn``."""

    dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset]
    fn: Callable[..., Any]

    @tf.autograph.experimental.do_not_convert
    def __call__(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        return self.dataset_fn(input_context).map(self.fn)


@dataclasses.dataclass(frozen=True)
class _Repeat:
    """``dataset_fn`` wrapper: each pipeline repeats its dataset.

    A tfdist `DatasetFn`'s stream is prefetched after the repeat too: its own prefetch ends
    each pass, so without this one every pass's first batch was made while the step waited
    (digits, 5 batches a pass). The order is the same; a user's dataset_fn is repeated as is.
    """

    dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset]

    # Builds a pipeline, no graph code: autograph (PS traces dataset_fns) would
    # mis-bind the wrapped DatasetFn's methods.
    @tf.autograph.experimental.do_not_convert
    def __call__(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        repeated = self.dataset_fn(input_context).repeat()
        return repeated.prefetch(tf.data.AUTOTUNE) if _is_own(self.dataset_fn) else repeated


def _is_own(dataset_fn: Any) -> bool:
    """Whether ``dataset_fn`` is a tfdist `DatasetFn`, maybe inside our wrappers."""
    while isinstance(dataset_fn, (_Map, _Repeat, _Skip)):
        dataset_fn = dataset_fn.dataset_fn
    return isinstance(dataset_fn, DatasetFn)


@dataclasses.dataclass(frozen=True)
class _Skip:
    """``dataset_fn`` wrapper: each pipeline skips its batches of the first ``num_steps`` steps."""

    dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset]
    num_steps: int

    @tf.autograph.experimental.do_not_convert
    def __call__(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        # One global step takes one per-replica batch for each of this pipeline's replicas.
        return self.dataset_fn(input_context).skip(
            self.num_steps * replicas_per_pipeline(input_context)
        )


def check_evaluation_steps(name: str, steps: int | None, source: InputSource) -> None:
    """Refuses more evaluation steps than one pass holds (evaluation never repeats the data).

    Raises:
        ValueError: Naming ``name`` and the pass length.
    """
    if steps is not None and source.steps_per_epoch is not None and steps > source.steps_per_epoch:
        raise invalid_argument(
            name,
            steps,
            f"at most {source.steps_per_epoch}, the batches in one pass over the data",
            note="Evaluation counts each example once and does not repeat the data; "
            f"pass {name}=None for one full pass.",
        )


def _array_input(
    data: tuple[Any, ...], gbs: int, *, shuffle: bool | str, seed: int, argument: str
) -> InputSource:
    """``(x, y[, sample_weight])`` arrays, each nested as the model's inputs/outputs, batched."""
    arrays = tf.nest.map_structure(np.asarray, _lists_as_tuples(data))
    leaves = tf.nest.flatten(arrays)
    if any(a.ndim == 0 for a in leaves) or len({len(a) for a in leaves}) != 1:
        shapes = tf.nest.map_structure(lambda a: a.shape, arrays)
        raise invalid_argument(argument, shapes, "arrays with the same first dimension")
    n = len(leaves[0])
    ds = tf.data.Dataset.from_tensor_slices(arrays)
    if shuffle is True:
        ds = ds.shuffle(n, seed=seed, reshuffle_each_iteration=True)
    ds = ds.batch(gbs)
    if shuffle == "batch":
        ds = ds.map(functools.partial(_shuffle_batch, seed=seed))
    ds = ds.prefetch(tf.data.AUTOTUNE)
    return InputSource(gbs, ds.element_spec, -(-n // gbs), dataset=ds)


def _lists_as_tuples(structure: Any) -> Any:
    """Lists (one array per input or output) as tuples: tf.data would stack a list into one."""
    if isinstance(structure, (list, tuple)):
        return tuple(_lists_as_tuples(s) for s in structure)
    if isinstance(structure, dict):
        return {k: _lists_as_tuples(v) for k, v in structure.items()}
    return structure


def _shuffle_batch(*batch: Any, seed: int) -> Any:
    """One batch, its examples in a random order (the same order for x, y and weights)."""
    size = tf.shape(tf.nest.flatten(batch)[0])[0]
    order = tf.random.shuffle(tf.range(size), seed=seed)
    return tf.nest.map_structure(lambda t: tf.gather(t, order), batch)


def _finite_cardinality(ds: tf.data.Dataset) -> int | None:
    n = int(ds.cardinality())
    return n if n >= 0 else None


@dataclasses.dataclass(frozen=True)
class Reading:
    """How `as_input` reads one data argument: for training or evaluation, and how.

    Attributes:
        training: Training arrays are shuffled as ``shuffle`` says; evaluation data is not.
        argument: The argument's name in error messages.
        shuffle: For training arrays, as Keras's ``fit``: ``True`` reshuffles
            every epoch (seeded), ``False`` keeps the order, ``"batch"``
            keeps the batches in order and shuffles inside each.
        seed: Shuffle seed for array inputs.
        steps: For evaluation data, the batches each pass reads (``validation_steps``,
            ``evaluate``'s ``steps``): a Python generator is read as Keras reads it then
            (`tfdist.data.python_inputs.python_dataset`).
    """

    training: bool
    argument: str = "x"
    shuffle: bool | str = True
    seed: int = 0
    steps: int | None = None


def as_input(
    data: Any,
    reading: Reading,
    *,
    input_context: tf.distribute.InputContext,
    global_batch_size: int | None,
    fallback_global_batch_size: int | None = None,
) -> InputSource:
    """Builds an `InputSource` from any accepted form of ``data``.

    Args:
        data: See the module docstring.
        reading: What the data is for and how it is read (`Reading`).
        input_context: This process's input context (pipelines and replicas).
        global_batch_size: Examples per step across all replicas. Optional
            except for an unbound ``DatasetFn``: for a dataset_fn it defaults
            to the first per-replica batch's size times the replicas in sync,
            for a dataset to its first batch's size, for arrays to 32.
        fallback_global_batch_size: Used for an unbound ``DatasetFn`` when
            ``global_batch_size`` is not given (e.g. the batch ``fit`` used).

    Raises:
        ValueError: For an unsupported type, a missing or indivisible global
            batch size.
    """
    training, argument = reading.training, reading.argument
    replicas = input_context.num_replicas_in_sync
    per_replica = callable(data) and not isinstance(data, tf.data.Dataset)  # a dataset_fn
    if global_batch_size is not None:
        check_global_batch_size(
            global_batch_size, replicas, training=training, per_replica=per_replica
        )

    if isinstance(data, DatasetFn):
        gbs = global_batch_size or data.global_batch_size or fallback_global_batch_size
        return _dataset_fn_input(data, gbs, input_context, training=training, argument=argument)

    if isinstance(data, tf.data.Dataset):
        return _dataset_input(data, global_batch_size, argument=argument)

    if is_python_input(data):
        ds, first_batch_size, num_batches, hooks = python_dataset(
            data,
            training=training,
            shuffle=reading.shuffle,
            seed=reading.seed,
            argument=argument,
            steps=reading.steps,
        )
        gbs = global_batch_size or first_batch_size
        return InputSource(
            gbs, ds.element_spec, num_batches, dataset=ds, in_process=True, epoch_hooks=hooks
        )

    if callable(data):
        return _callable_input(data, global_batch_size, input_context, argument=argument)

    if isinstance(data, tuple) and 1 <= len(data) <= 3:  # (x,): a model's own add_loss
        gbs = global_batch_size or DEFAULT_GLOBAL_BATCH_SIZE
        check_global_batch_size(gbs, replicas, training=training, per_replica=False)
        shuffle = reading.shuffle if training else False
        return _array_input(data, gbs, shuffle=shuffle, seed=reading.seed, argument=argument)

    note = (
        f"For a built-in dataset pass tfdist.data.load({data!r})." if isinstance(data, str) else ""
    )
    raise invalid_argument(
        argument,
        data if isinstance(data, str) else type(data).__name__,
        "a tfdist.data.DatasetFn, a dataset_fn(input_context), a tf.data.Dataset of "
        "global batches, a Python generator or keras.utils.PyDataset of global batches, "
        "or arrays (x with y)",
        note=note,
    )


def _dataset_fn_input(
    data: DatasetFn,
    gbs: int | None,
    input_context: tf.distribute.InputContext,
    *,
    training: bool,
    argument: str,
) -> InputSource:
    """A `DatasetFn`, bound to the global batch ``gbs`` (required)."""
    if gbs is None:
        raise invalid_argument(
            "global_batch_size",
            None,
            "a positive integer",
            note=f"`{argument}` is the unbound dataset {data.name!r}; "
            "pass global_batch_size to fit/evaluate.",
        )
    bound = data.bind(global_batch_size=gbs, training=training)
    spec = bound(input_context).element_spec
    return InputSource(gbs, spec, bound.steps_per_epoch(), dataset_fn=bound, exact=bool(training))


def _dataset_input(
    data: tf.data.Dataset, global_batch_size: int | None, *, argument: str
) -> InputSource:
    """A dataset of global batches; its batch size by default from its spec or first batch."""
    spec = data.element_spec
    first = tf.nest.flatten(spec)[0]
    static = first.shape[0] if first.shape.rank else None
    gbs = global_batch_size or static or read_batch_size(data, argument)
    return InputSource(int(gbs), spec, _finite_cardinality(data), dataset=data)


def _callable_input(
    data: Any,
    global_batch_size: int | None,
    input_context: tf.distribute.InputContext,
    *,
    argument: str,
) -> InputSource:
    """A ``dataset_fn(input_context)``; its global batch by default from its first batch."""
    ds = data(input_context)
    if not isinstance(ds, tf.data.Dataset):
        raise invalid_argument(
            argument,
            data,
            "a dataset_fn(input_context) that returns a tf.data.Dataset",
            note=f"It returned {type(ds).__name__}.",
        )
    gbs = global_batch_size
    if gbs is None:
        replicas = input_context.num_replicas_in_sync
        gbs = read_batch_size(ds, argument) * replicas
        logger.info(
            "`%s` is a dataset_fn and global_batch_size was not given: using %d (its first "
            "per-replica batch times %d replicas).",
            argument,
            gbs,
            replicas,
        )
    n = _finite_cardinality(ds)
    # The last step may be partial: ceil, so that no per-replica batch is left out.
    steps = None if n is None else math.ceil(n / replicas_per_pipeline(input_context))
    return InputSource(gbs, ds.element_spec, steps, dataset_fn=data)
