"""Datasets as dataset_fns, and the global -> per-replica batch arithmetic.

import tfdist
train_fn = tfdist.data.load("digits", split="train").bind(global_batch_size=128)
dist_ds = strategy.distribute_datasets_from_function(train_fn)

Modules (start at ``datasets``):

- ``datasets``: the built-in datasets by name, and ``load``, the one entry point to them.
- ``arrays``: the in-memory datasets: scikit-learn's "digits", "synthetic" and "patterns".
- ``text``: "python_source": the interpreter's standard library as next-byte windows.
- ``tfds_source``: prepared TensorFlow Datasets (``"tfds:NAME"``), never downloaded.
- ``dataset_fn``: ``DatasetFn``: per-replica batches, bound to a global batch size.
- ``batch_sizes``: global -> per-replica batch sizes and input-pipeline arithmetic.
- ``batch_size``: a dataset's batch size, read off its graph.
- ``inputs``: what ``Trainer.fit`` receives, as one ``InputSource``.
- ``python_inputs``: generators and ``keras.utils.PyDataset`` as Keras reads them.
- ``release``: finished input iterators, let go of on background threads.
"""

from tfdist.data.batch_sizes import per_replica_batch_size
from tfdist.data.datasets import DatasetFn, load

__all__ = ["DatasetFn", "load", "per_replica_batch_size"]
