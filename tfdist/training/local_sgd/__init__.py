"""Local SGD and DiLoCo: each replica trains on its own, and the replicas sync every H updates.

Start at ``options`` (``LocalSGDOptions``, the refusals), then ``sync`` (what is averaged and
what stays local, and how one sync runs).

- ``options``: ``LocalSGDOptions(sync_every=H, outer_optimizer=None, fragments=1)`` and the
  refusals of ``Trainer(local_sgd=...)``.
- ``fragments``: streaming DiLoCo's ``fragments=K``: the averaged variables cut in model order
  into ``K`` pieces balanced by bytes, and the staggered schedule (one every ``H / K`` updates).
- ``sync``: ``LocalState``: the last synced parameters, the outer optimizer (one per fragment),
  the one all-reduce of a sync, in cross-replica context; what a backup holds.
- ``replicas``: ``ReplicaCopies``: every replica's own parameters, statistics and inner slots in
  a backup (one all-gather at a save), handed back at a resume on the same replica count, or
  averaged as a sync of the partial round on another (elastic resume).
- ``update``: ``LocalUpdate``, the replica step without the per-update gradient exchange
  (adapting to stragglers: driven from cross-replica context, a skipped update undone).
- ``stragglers``: ``adapt_to_stragglers``'s arithmetic: which updates a slower worker takes,
  its steps a round from the measured rates, the sync's weights by the steps taken.
"""
