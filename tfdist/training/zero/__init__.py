"""Sharded optimizer state and gradients over the replicas (ZeRO-1 and ZeRO-2), and parameters
too (ZeRO-3, ``sharding="parameters"``).

Start at ``state`` (the design, the master shards, the optimizer built on them, refusals).
It does not know the pipeline: the two meet in `tfdist.training.updates`.

- ``state``: master shards, the sharded optimizer, refusals, bytes per replica.
- ``update``: ``ShardedUpdate``: the reduce-scatter, the update on the shards, the all-gather.
- ``per_layer``: ZeRO-2's reduce-scatter inside the backward, one top-level layer at a time.
- ``collectives``: the sharded update's collectives, in buckets of bounded size, one at a time.
- ``layout``: how a variable is cut into one zero-padded block per replica.
- ``checkpoint``: sharded slots (and ZeRO-3's blocks) saved and loaded as whole tensors.
- ``parameters``: ZeRO-3's storage (every weight a block per replica; whole again between fits).
- ``parameters_update``: ``ParametersUpdate``: the Trainer's update on it, and its evaluation.
- ``units``: the forward pass one top-level layer at a time, each gathered and reduce-scattered.
- ``named_units``: the layers ``units=`` names, found anywhere in the model; its refusals.
"""
