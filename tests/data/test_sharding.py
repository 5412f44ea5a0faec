"""Tests for tfdist.data.batch_sizes: global -> per-replica batch arithmetic."""

import numpy as np
import pytest
import tensorflow as tf

from tfdist.data import per_replica_batch_size
from tfdist.data.batch_sizes import default_input_context, replicas_per_pipeline


@pytest.mark.parametrize(
    "global_batch_size, replicas, expected",
    [(128, 1, 128), (128, 4, 32), (9, 3, 3), (np.int64(64), 2, 32)],
)
def test_per_replica_batch_size_divides(global_batch_size, replicas, expected):
    result = per_replica_batch_size(global_batch_size, replicas)
    assert result == expected and type(result) is int


def test_indivisible_names_replicas_and_nearest_values():
    with pytest.raises(ValueError) as e:
        per_replica_batch_size(128, 3)
    msg = str(e.value)
    assert msg.startswith(
        "Invalid value for argument `global_batch_size`. Received: global_batch_size=128."
    )
    assert "a positive multiple of the number of replicas in sync (3)" in msg
    assert "126 or 129" in msg
    # Or keep the global batch (a resumed backup needs it) on a replica count that divides it.
    assert "To keep global_batch_size=128 (as a resumed backup needs" in msg
    assert "run on 2 or 4 replicas, which divide it." in msg


def test_indivisible_below_replicas_suggests_only_positive_value():
    with pytest.raises(ValueError, match=r"nearest valid values are 4\.") as e:
        per_replica_batch_size(2, 4)
    assert " or " not in str(e.value).split("nearest")[1].split(".")[0]
    assert "run on 2 replicas, which divide it." in str(e.value)


@pytest.mark.parametrize("bad", [0, -8, 8.0, "8", None, True])
def test_not_a_positive_int(bad):
    with pytest.raises(ValueError) as e:
        per_replica_batch_size(bad, 2)
    msg = str(e.value)
    assert f"Received: global_batch_size={bad!r}." in msg
    assert "a positive multiple of the number of replicas in sync (2)" in msg


@pytest.mark.parametrize("bad", [0, -1, 2.0])
def test_bad_num_replicas(bad):
    with pytest.raises(ValueError, match="argument `num_replicas_in_sync`"):
        per_replica_batch_size(8, bad)


def test_replicas_per_pipeline():
    ctx = tf.distribute.InputContext(
        num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=6
    )
    assert replicas_per_pipeline(ctx) == 3
    with pytest.raises(ValueError, match="argument `input_context`"):
        replicas_per_pipeline(
            tf.distribute.InputContext(
                num_input_pipelines=2, input_pipeline_id=0, num_replicas_in_sync=3
            )
        )


def test_default_input_context():
    ctx = default_input_context()
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (1, 0, 1)
    assert ctx.get_per_replica_batch_size(32) == 32
