"""A plain dataset iterator behind a distributed dataset whose worker has one CPU replica.

TF's ``distribute_datasets_from_function`` under the default input options makes a
multi-device iterator for every iterator, even for one device: about 0.17 s each time on a
2-core Xeon (it traces its own functions per iterator), paid by every ``fit`` call, every
epoch of a finite input, and every ``evaluate`` and ``predict``. TF's own input code has the
plain path (``iter(dataset)`` on the worker, used by MirroredStrategy's per-replica mode), but
one_device and MultiWorkerMirrored refuse that mode's options up front. With one replica on
the host's CPU, the data already sits where the step runs, so the plain path yields the same
elements in the same order; `plain_iterator` switches a distributed dataset to it by its
options, before any iterator is made.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdist._compat.tf_internals.runtime import is_default_strategy


def one_cpu_replica(strategy: tf.distribute.Strategy) -> bool:
    """Whether this worker's only replica runs on a CPU (one_device, MWMS on CPUs)."""
    if is_default_strategy(strategy):
        return False  # no worker_devices; its distributed datasets are plain datasets already
    devices = strategy.extended.worker_devices
    return len(devices) == 1 and tf.DeviceSpec.from_string(devices[0]).device_type == "CPU"


def plain_iterator(distributed: Any) -> Any:
    """``distributed`` (from ``distribute_datasets_from_function``, default options), whose
    iterators are then plain ``iter(dataset)`` on the worker. Returns it unchanged when its
    class is not the one this knows (a TF change): TF's default then stays."""
    options = getattr(distributed, "_options", False)
    if options is not None or type(distributed).__name__ != "DistributedDatasetsFromFunction":
        return distributed
    distributed._options = tf.distribute.InputOptions(
        experimental_fetch_to_device=False,
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
    )
    return distributed


def static_batch_size(dataset: tf.data.Dataset) -> int | None:
    """The batch size tf.data's graph analysis reads off ``dataset`` (None when it cannot).

    The same analysis tf.distribute runs to split a dataset's batches over replicas
    (``compute_batch_size``, not public); it follows ``batch``, ``padded_batch``, ``shuffle``,
    ``prefetch``, ``take``, ``zip``... but not a ``map`` after the batch. It reads no element:
    a peek would make an iterator, and each iterator of a reshuffling dataset draws its next order.
    """
    try:
        from tensorflow.python.data.experimental.ops import distribute

        size = int(distribute.compute_batch_size(dataset))
    except (ImportError, AttributeError, IndexError, ValueError, tf.errors.OpError):
        return None  # TF moved it, or no batch in the graph: the caller reads a batch instead
    return size if size > 0 else None
