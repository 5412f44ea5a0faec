"""Model parallelism by pipeline stages, and the hybrid with ``multi_worker``.

Start at ``options`` (``PipelineOptions``, each stage's device), then ``cut`` and ``update``.
It does not know sharded optimizer state: the two meet in `tfdist.training.updates`.

- ``options``: ``PipelineOptions``, the stages' devices and placement.
- ``cut``: a model cut into stages: where it can be cut, what crosses each cut.
- ``auto_split``: ``split_at="auto"``: stages of about equal parameter bytes.
- ``checks``: the refusals of ``Trainer(pipeline=...)``, before anything trains.
- ``schedule``: one update's micro-batches through the stages, GPipe or 1F1B.
- ``update``: ``PipelineUpdate``: the schedule as the replica step, inference through the stages.
"""
