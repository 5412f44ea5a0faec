"""TensorFlow's private names that tfdist uses, each behind one named function.

- ``runtime``: the TF runtime's and strategies' own state, which no public API exposes.
- ``coordinator``: ``ClusterCoordinator``: each scheduled call watched and cancellable alone.
- ``checkpoint``: ``tf.train.Checkpoint``'s asynchronous writer: its error, letting it go.
- ``inputs``: a plain iterator behind a distributed dataset of one CPU replica.
- ``partitioned``: shims for ``ShardedVariable``: parameter servers' partitioned variables.
- ``whole_tensor``: a trackable saved and restored as one whole tensor (ZeRO's sharded slots).
- ``profiler``: TF profiler traces read back as op events.
- ``bench``: TF internals the benchmarks read.
"""
