"""The sharded update's gather (tfdist/training/zero/collectives.py), mirrored x2, in one
tf.function: each replica's blocks become every replica's whole variables, each written by one
dense assign. A slice assign would put the variable in TF's copy-on-read mode for good (every
later dense read, a layer's forward, copies it whole), so the traced graph must hold none.
"""

import numpy as np
import tensorflow as tf

import tfdist
from tfdist.training.zero.collectives import gather_into
from tfdist.training.zero.layout import block

# Row-aligned blocks ([4, 6] over 2 replicas: 2 rows each), a padded one ([3]: S = 2), and one
# larger than a bucket (gathered alone, not in column chunks).
WHOLE = [np.arange(24, dtype="float32").reshape(4, 6), np.array([7.0, -0.0, 9.0], "float32")]
WHOLE.append(np.linspace(-1, 1, 64, dtype="float32").reshape(8, 8))


def test_the_gather_writes_every_variable_whole_by_dense_assigns():
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    with strategy.scope():
        targets = [tf.Variable(tf.zeros(w.shape)) for w in WHOLE]

    def step():
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        mine = [block(tf.constant(w), 2, replica) for w in WHOLE]
        constraints = [None, None, lambda t: t * 2.0]  # on the whole tensor
        gather_into(mine, targets, constraints, num_replicas=2, bucket_bytes=64)

    fn = tf.function(lambda: strategy.run(step), autograph=False)
    kinds = {op.type for op in fn.get_concrete_function().graph.get_operations()}
    assert "ResourceStridedSliceAssign" not in kinds and "AssignVariableOp" in kinds
    fn()
    expected = [WHOLE[0], WHOLE[1], WHOLE[2] * 2.0]
    for target, want in zip(targets, expected):
        for copy in strategy.experimental_local_results(target):
            got = copy.numpy()
            assert got.tobytes() == want.tobytes()  # bitwise: -0.0 stays -0.0
