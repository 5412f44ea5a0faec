"""Local SGD and DiLoCo: each replica trains on its own, and the replicas sync every H updates.

Start at ``options`` (``LocalSGDOptions``, the refusals), then ``sync`` (what is averaged and
what stays local, and how one sync runs).

- ``options``: ``LocalSGDOptions(sync_every=H, outer_optimizer=None)`` and the refusals of
  ``Trainer(local_sgd=...)``.
- ``sync``: ``LocalState``: the last synced parameters, the outer optimizer, the one all-reduce
  of a sync, in cross-replica context.
- ``update``: ``LocalUpdate``, the replica step without the per-update gradient exchange.
"""
