"""InputSource: inferred global batch sizes, step counts, repeating and skipping inside tf.data."""

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.jobs.common import data
from tfdist.data.batch_sizes import default_input_context
from tfdist.data.inputs import Reading, as_input


def test_global_batch_size_inference():
    x, y = data(40)
    ctx = tf.distribute.InputContext(
        num_input_pipelines=2, input_pipeline_id=0, num_replicas_in_sync=4
    )
    source = as_input(
        lambda c: tf.data.Dataset.from_tensor_slices((x, y)).batch(5),
        Reading(training=False),
        input_context=ctx,
        global_batch_size=None,
    )
    assert source.global_batch_size == 20  # 5 per replica x 4 replicas
    assert source.steps_per_epoch == 4  # ceil(8 batches / 2 replicas per pipeline)
    with pytest.raises(ValueError, match=r"argument `global_batch_size`.*unbatched elements"):
        as_input(
            lambda c: tf.data.Dataset.from_tensor_slices(y),
            Reading(training=False),
            input_context=ctx,
            global_batch_size=None,
        )
    with pytest.raises(
        ValueError, match=r"argument `global_batch_size`.*`validation_data` yields no batches"
    ):
        as_input(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(4).take(0),
            Reading(training=False, argument="validation_data"),
            input_context=ctx,
            global_batch_size=None,
        )


def test_skipping_and_repeating_happen_in_tf_data():
    x = np.arange(24)
    ctx = tf.distribute.InputContext(
        num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4
    )
    by_fn = as_input(
        lambda c: tf.data.Dataset.from_tensor_slices(x).shard(2, c.input_pipeline_id).batch(2),
        Reading(training=True),
        input_context=ctx,
        global_batch_size=8,
    )
    # One global step takes two per-replica batches of each pipeline.
    first = [b.numpy().tolist() for b in by_fn.repeated().skipping(2).dataset_fn(ctx).take(3)]
    assert first == [
        [17, 19],
        [21, 23],
        [1, 3],
    ]  # pipeline 1 holds the odd numbers, 6 batches a pass
    by_dataset = as_input(
        tf.data.Dataset.from_tensor_slices(x).batch(8),
        Reading(training=True),
        input_context=default_input_context(),
        global_batch_size=None,
    )
    assert [b.numpy()[0] for b in by_dataset.repeated().skipping(2).dataset.take(2)] == [16, 0]


@pytest.mark.parametrize("pipelines,pipeline,replicas", [(1, 0, 1), (1, 0, 2), (2, 1, 2)])
def test_a_repeated_dataset_fn_gives_the_same_batches_in_the_same_order(
    pipelines, pipeline, replicas
):
    # The repeated stream is prefetched after its repeat: the same examples, passes and
    # reshuffles as the DatasetFn repeated plainly, skipped or not.
    ctx = tf.distribute.InputContext(pipelines, pipeline, replicas)
    source = as_input(
        tfdist.data.load("digits", split="train", seed=3),
        Reading(training=True),
        input_context=ctx,
        global_batch_size=256,
    )
    per_pass = source.steps_per_epoch * replicas // pipelines
    plain = [y.numpy().tolist() for _, y in source.dataset_fn(ctx).repeat().take(3 * per_pass)]
    streamed = source.repeated().dataset_fn(ctx).take(3 * per_pass)
    assert [y.numpy().tolist() for _, y in streamed] == plain
    skipped = source.repeated().skipping(2).dataset_fn(ctx).take(per_pass)
    assert [y.numpy().tolist() for _, y in skipped] == plain[2 * replicas // pipelines :][:per_pass]
    epoch = source.for_epoch(1)
    once = [y.numpy().tolist() for _, y in epoch.dataset_fn(ctx)]
    assert [y.numpy().tolist() for _, y in epoch.repeated().dataset_fn(ctx).take(per_pass)] == once


def test_batch_size_is_read_without_drawing_an_order():
    """A reshuffling dataset's batch size comes off its graph: its first pass is still unread.

    Each iterator draws the next order, so a peek would hand the first epoch the second one
    (and fails this test when TF moves the graph analysis, ``_compat.inputs.static_batch_size``).
    """

    def reshuffling():
        return tf.data.Dataset.range(10).shuffle(10, seed=3, reshuffle_each_iteration=True)

    ctx = tf.distribute.InputContext(num_replicas_in_sync=2)
    source = as_input(
        reshuffling().batch(4), Reading(training=True), input_context=ctx, global_batch_size=None
    )
    assert source.global_batch_size == 4
    first_pass = [b.numpy().tolist() for b in reshuffling().batch(4)]
    assert [b.numpy().tolist() for b in source.dataset] == first_pass
    # A map after the batch hides it from the analysis: the first element tells it.
    mapped = reshuffling().batch(4).map(lambda b: b * 2)
    assert (
        as_input(
            mapped, Reading(training=False), input_context=ctx, global_batch_size=None
        ).global_batch_size
        == 4
    )
