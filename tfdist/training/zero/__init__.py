"""Sharded optimizer state and gradients over the replicas (ZeRO-1 and ZeRO-2).

Start at ``state`` (the design, the master shards, the optimizer built on them, refusals).

- ``state``: master shards, the sharded optimizer, refusals, bytes per replica.
- ``update``: ``ShardedUpdate``: the reduce-scatter, the update on the shards, the all-gather.
- ``collectives``: the sharded update's collectives, in buckets of bounded size, one at a time.
"""
