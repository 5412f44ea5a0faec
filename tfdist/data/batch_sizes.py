"""Global -> per-replica batch sizes and input-pipeline arithmetic.

``global_batch_size`` travels one way (see DESIGN.md): the Trainer hands it to a
dataset_fn, which divides it here by ``num_replicas_in_sync``. This is the one
place that checks the division and words the error.

Everything here is plain Python and runs outside any replica context.
"""

from __future__ import annotations

import numbers

import tensorflow as tf

from tfdist.config import invalid_argument


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def per_replica_batch_size(
    global_batch_size: int, num_replicas_in_sync: int, *, training: bool = True
) -> int:
    """Splits a global batch evenly across the replicas in sync.

    Args:
        global_batch_size: Examples per step summed over all replicas of all
            workers.
        num_replicas_in_sync: ``strategy.num_replicas_in_sync`` (or
            ``input_context.num_replicas_in_sync``).
        training: Whether the batches train (the error then tells how a resumed
            backup keeps its global batch); else evaluation or prediction of
            per-replica batches (the error names the inputs that take any size).

    Returns:
        ``global_batch_size // num_replicas_in_sync``.

    Raises:
        ValueError: If ``num_replicas_in_sync`` is not a positive int, or if
            ``global_batch_size`` is not a positive int divisible by it. The
            message suggests the nearest valid global batch sizes.
    """
    if not _is_int(num_replicas_in_sync) or num_replicas_in_sync < 1:
        raise invalid_argument("num_replicas_in_sync", num_replicas_in_sync, "a positive integer")
    replicas = int(num_replicas_in_sync)
    expected = f"a positive multiple of the number of replicas in sync ({replicas})"
    if not _is_int(global_batch_size) or global_batch_size < 1:
        note = f"For example global_batch_size={replicas * 32} (32 examples per replica)."
        raise invalid_argument("global_batch_size", global_batch_size, expected, note=note)
    global_batch_size = int(global_batch_size)
    if global_batch_size % replicas:
        lower = (global_batch_size // replicas) * replicas
        upper = lower + replicas
        nearest = f"{lower} or {upper}" if lower > 0 else f"{upper}"
        note = (
            f"It cannot be split evenly across {replicas} replicas; "
            f"the nearest valid values are {nearest}. "
            + (_replica_counts(global_batch_size, replicas) if training else _ANY_SIZE)
        )
        raise invalid_argument("global_batch_size", global_batch_size, expected, note=note)
    return global_batch_size // replicas


def check_global_batch_size(
    global_batch_size: int, num_replicas_in_sync: int, *, training: bool, per_replica: bool
) -> None:
    """Checks a global batch: in training, or of a per-replica input, it must divide evenly.

    Evaluating or predicting global batches (arrays, a ``tf.data.Dataset``) takes any positive
    size, as Keras does: tf.distribute splits a batch of b into ``ceil(b / replicas)`` and
    ``floor(b / replicas)`` shares, as it splits a partial batch; each example counts once.

    Raises:
        ValueError: As `per_replica_batch_size`, or for a value that is not a positive int.
    """
    if training or per_replica:
        per_replica_batch_size(global_batch_size, num_replicas_in_sync, training=training)
    elif not _is_int(global_batch_size) or global_batch_size < 1:
        raise invalid_argument("global_batch_size", global_batch_size, "a positive integer")


#: Why a per-replica input for evaluate/predict needs a divisible batch, and what takes any.
_ANY_SIZE = (
    "A dataset_fn or tfdist.data.DatasetFn batches per replica; evaluate and predict take any "
    "batch size from arrays or a tf.data.Dataset of global batches (split unevenly over the "
    "replicas, as tf.distribute splits a partial batch)."
)


def _replica_counts(global_batch_size: int, replicas: int) -> str:
    """Which replica counts nearest ``replicas`` divide ``global_batch_size``, as a sentence.

    Keeping the global batch matters when resuming a backup: its position counts global batches.
    """
    below = max(d for d in range(1, replicas) if global_batch_size % d == 0)
    above = next(
        (d for d in range(replicas + 1, global_batch_size + 1) if global_batch_size % d == 0), None
    )
    counts = f"{below} or {above}" if above else f"{below}"
    return (
        f"To keep global_batch_size={global_batch_size} (as a resumed backup needs, to continue "
        f"at the same data), run on {counts} replicas, which divide it."
    )


def replicas_per_pipeline(input_context: tf.distribute.InputContext) -> int:
    """Returns how many replicas one input pipeline feeds.

    Each input pipeline (usually one per worker) yields per-replica batches for
    ``num_replicas_in_sync // num_input_pipelines`` local replicas, so one
    global step consumes that many of its batches.

    Args:
        input_context: The context passed to a dataset_fn.

    Returns:
        The number of replicas per input pipeline, at least 1.

    Raises:
        ValueError: If the replicas do not divide evenly among the pipelines.
    """
    pipelines = input_context.num_input_pipelines
    replicas = input_context.num_replicas_in_sync
    if pipelines < 1 or replicas < pipelines or replicas % pipelines:
        raise invalid_argument(
            "input_context",
            f"InputContext(num_input_pipelines={pipelines}, input_pipeline_id="
            f"{input_context.input_pipeline_id}, num_replicas_in_sync={replicas})",
            "num_replicas_in_sync to be a positive multiple of num_input_pipelines",
        )
    return replicas // pipelines


def default_input_context() -> tf.distribute.InputContext:
    """Returns the context of a single pipeline feeding a single replica.

    Used when a dataset_fn is called without a strategy: the per-replica batch
    is then the global batch.
    """
    return tf.distribute.InputContext(
        num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1
    )
