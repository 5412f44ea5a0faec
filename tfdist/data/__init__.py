"""Datasets as dataset_fns, and the global -> per-replica batch arithmetic.

import tfdist
train_fn = tfdist.data.load("digits", split="train").bind(global_batch_size=128)
dist_ds = strategy.distribute_datasets_from_function(train_fn)
"""

from tfdist.data.batch_sizes import per_replica_batch_size
from tfdist.data.datasets import DatasetFn, load

__all__ = ["DatasetFn", "load", "per_replica_batch_size"]
