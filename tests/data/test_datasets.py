"""Tests for tfdist.data.datasets: sharding, batch counts, evaluation top-up batches, tfds."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import tfdist.data
from tfdist.data import DatasetFn, load


def ctx(pipelines, pipeline_id, replicas):
    return tf.distribute.InputContext(
        num_input_pipelines=pipelines, input_pipeline_id=pipeline_id, num_replicas_in_sync=replicas
    )


def rows(x):
    """Each example as bytes, for set comparisons."""
    x = np.asarray(x, np.float32)
    return [r.tobytes() for r in x.reshape(len(x), int(np.prod(x.shape[1:])))]


def full_split(name, split):
    fn = load(name, split=split, training=False, global_batch_size=10_000)
    ((x, y),) = list(fn())  # one evaluation batch holding the whole split
    assert len(x) == len(y) == fn.num_examples
    return x.numpy(), y.numpy()


def evaluation_batches(ds, *, per_replica, expected_batches, input_shape):
    """Checks one evaluation pipeline's batch structure.

    Returns its real (x rows, labels) and batch sizes.

    Contract: ``(x, y)`` batches of at most ``per_replica`` examples, all full except the last
    non-empty one, then only empty (batch dimension 0) top-up batches; ``expected_batches`` in all.
    """
    xs, ys, sizes = [], [], []
    for batch in ds:
        assert len(batch) == 2  # (x, y): no sample weights
        x, y = batch
        n = int(x.shape[0])
        assert x.shape == (n, *input_shape) and x.dtype == tf.float32
        assert y.shape == (n,) and y.dtype == tf.int32
        sizes.append(n)
        xs += rows(x.numpy())
        ys += list(y.numpy())
    assert len(sizes) == expected_batches
    assert all(0 <= n <= per_replica for n in sizes)
    real = [n for n in sizes if n]
    assert sizes == real + [0] * (len(sizes) - len(real))  # empty batches only at the end
    assert all(n == per_replica for n in real[:-1])  # only the last real batch may be partial
    assert len(xs) == len(ys) == sum(sizes)
    return xs, ys, sizes


def test_exports():
    assert {"load", "DatasetFn", "per_replica_batch_size"} <= set(tfdist.data.__all__)


def test_digits_metadata_and_splits():
    train, val = load("digits"), load("digits", split="validation")
    assert (train.num_examples, val.num_examples) == (1437, 360)
    assert train.input_shape == (8, 8, 1) and train.num_classes == 10
    assert train.training and not val.training and train.global_batch_size is None
    assert (
        load("digits", split="test").num_examples == 360
        and load("digits", split="all").num_examples == 1797
    )
    x, y = full_split("digits", "validation")
    assert x.dtype == np.float32 and x.min() >= 0.0 and x.max() <= 1.0 and y.dtype == np.int32
    # The fixed stratified split: train and validation are disjoint, with all 1797 images' rows.
    xt, _ = full_split("digits", "train")
    assert len(set(rows(xt)) & set(rows(x))) < 20  # digits has a few duplicate images, nothing more


def test_bind_returns_new_copy_and_validates():
    fn = load("digits")
    bound = fn.bind(global_batch_size=64, seed=3)
    assert fn.global_batch_size is None and bound.global_batch_size == 64 and bound.seed == 3
    assert bound.bind(global_batch_size=32, training=False).training is False
    for bad in (0, -4, 2.5):
        with pytest.raises(ValueError, match="argument `global_batch_size`"):
            fn.bind(global_batch_size=bad)
    with pytest.raises(ValueError, match="at most the 1437 examples"):
        fn.bind(global_batch_size=2048)
    with pytest.raises(ValueError, match=r"call \.bind\(global_batch_size=\.\.\.\) first"):
        fn()
    with pytest.raises(ValueError, match=r"call \.bind"):
        fn.steps_per_epoch()


def test_steps_per_epoch():
    assert load("digits", global_batch_size=128).steps_per_epoch() == 11  # 1437 // 128
    assert load("digits", global_batch_size=1437).steps_per_epoch() == 1
    val = load("digits", split="validation", global_batch_size=128)
    assert val.steps_per_epoch() == 3  # ceil(360 / 128)
    assert val.bind(global_batch_size=120).steps_per_epoch() == 3
    assert load("synthetic", num_examples=100, global_batch_size=32).steps_per_epoch() == 3
    assert (
        load("synthetic", num_examples=100, training=False, global_batch_size=32).steps_per_epoch()
        == 4
    )


def test_indivisible_batch_raises_our_error():
    fn = load("digits", global_batch_size=128)
    with pytest.raises(ValueError, match=r"replicas in sync \(3\).*126 or 129"):
        fn(ctx(1, 0, 3))


@pytest.mark.parametrize("per_replica", [12, 7])
@pytest.mark.parametrize("pipelines, replicas", [(1, 1), (2, 2), (2, 4), (3, 3), (3, 6)])
def test_evaluation_shards_cover_split_exactly_once(pipelines, replicas, per_replica):
    fn = load("digits", split="validation", global_batch_size=per_replica * replicas)
    expected_batches = fn.steps_per_epoch() * replicas // pipelines
    seen, labels = [], []
    for i in range(pipelines):
        ds = fn(ctx(pipelines, i, replicas))
        assert int(ds.cardinality()) == expected_batches
        xs, ys, _ = evaluation_batches(
            ds, per_replica=per_replica, expected_batches=expected_batches, input_shape=(8, 8, 1)
        )
        seen += xs
        labels += ys
    x_all, y_all = full_split("digits", "validation")
    assert len(seen) == fn.num_examples == 360  # counted by rows actually present
    assert sorted(seen) == sorted(rows(x_all))  # the same multiset of rows: each example once
    assert sorted(zip(seen, labels)) == sorted(zip(rows(x_all), y_all))


@pytest.mark.parametrize(
    "global_batch_size, pipelines, replicas, expected_sizes",
    [
        (32, 1, 1, [[32, 32, 32, 4]]),  # partial last batch, no top-up
        (12, 3, 6, [[2] * 17 + [0], [2] * 16 + [1, 0], [2] * 16 + [1, 0]]),  # shards of 34, 33, 33
        (48, 2, 4, [[12] * 4 + [2, 0]] * 2),  # shards of 50 in 6 batches each
        (40, 2, 4, [[10] * 5 + [0]] * 2),  # no partial batch, one top-up each
    ],
)
def test_evaluation_batch_sizes_and_disjoint_shards(
    global_batch_size, pipelines, replicas, expected_sizes
):
    fn = load(
        "synthetic", split="validation", num_examples=100, global_batch_size=global_batch_size
    )
    assert not fn.training
    per_replica = global_batch_size // replicas
    expected_batches = fn.steps_per_epoch() * replicas // pipelines
    shards, sizes = [], []
    for i in range(pipelines):
        xs, _, s = evaluation_batches(
            fn(ctx(pipelines, i, replicas)),
            per_replica=per_replica,
            expected_batches=expected_batches,
            input_shape=(8, 8, 1),
        )
        shards.append(xs)
        sizes.append(s)
    assert sizes == expected_sizes
    assert sum(map(sum, sizes)) == fn.num_examples
    for a in range(pipelines):
        assert len(set(shards[a])) == len(shards[a])  # synthetic rows are distinct: no repeats
        for b in range(a + 1, pipelines):
            assert not set(shards[a]) & set(shards[b])
    ((x_all, _),) = list(fn.bind(global_batch_size=10_000)())
    assert set().union(*map(set, shards)) == set(rows(x_all))


@pytest.mark.parametrize("pipelines, replicas", [(2, 2), (3, 6)])
def test_training_shards_disjoint_with_equal_counts(pipelines, replicas):
    fn = load("digits", global_batch_size=24 * replicas, seed=1)
    per_replica = 24
    counts, shards = [], []
    for i in range(pipelines):
        batches = list(fn(ctx(pipelines, i, replicas)))
        counts.append(len(batches))
        shards.append([r for x, y in batches for r in rows(x)])
        for x, y in batches:
            assert x.shape == (per_replica, 8, 8, 1) and y.shape == (per_replica,)
    assert counts == [fn.steps_per_epoch() * replicas // pipelines] * pipelines
    for a in range(pipelines):
        assert len(set(shards[a])) > 0.95 * len(
            shards[a]
        )  # no repeats beyond digits' duplicate images
        for b in range(a + 1, pipelines):
            assert len(set(shards[a]) & set(shards[b])) < 20


def _global_batches(fn, pipelines, replicas):
    """Each global step's examples (as a set of rows), gathered from every pipeline's batches."""
    r = replicas // pipelines
    per_pipeline = [list(fn(ctx(pipelines, i, replicas))) for i in range(pipelines)]
    return [
        {
            row
            for batches in per_pipeline
            for x, _ in batches[j * r : (j + 1) * r]
            for row in rows(x)
        }
        for j in range(len(per_pipeline[0]) // r)
    ]


def test_training_global_batches_do_not_depend_on_the_world_size():
    # A backup resumes on another number of workers or replicas at the same data: global batch j
    # is the same examples on 1 replica, 2 or 4 replicas of one worker, or 2 and 4 workers.
    fn = load("synthetic", num_examples=200, global_batch_size=24, seed=3)
    one = _global_batches(fn, 1, 1)
    assert len(one) == 8 and all(len(b) == 24 for b in one)
    for pipelines, replicas in [(1, 2), (1, 4), (2, 2), (2, 4), (4, 4)]:
        assert _global_batches(fn, pipelines, replicas) == one, (pipelines, replicas)


def test_training_reshuffles_each_iteration_and_is_seeded():
    fn = load("digits", global_batch_size=64, seed=7)
    ds = fn()
    first, second = [rows(x)[:5] for x, _ in ds.take(1)], [rows(x)[:5] for x, _ in ds.take(1)]
    assert first != second
    again = [rows(x)[:5] for x, _ in load("digits", global_batch_size=64, seed=7)().take(1)]
    assert again == first


@dataclasses.dataclass(frozen=True)
class UnevenSource:
    """Pipeline i holds sizes[i] examples, like uneven TFDS file shards."""

    sizes: tuple

    def examples(self, input_context, *, training, seed):
        n = self.sizes[input_context.input_pipeline_id]
        start = sum(self.sizes[: input_context.input_pipeline_id])
        x = np.arange(start, start + n, dtype=np.float32).reshape(n, 1, 1, 1)
        return tf.data.Dataset.from_tensor_slices((x, np.zeros(n, np.int32)))


@pytest.mark.parametrize("training", [True, False])
def test_equal_batch_counts_for_uneven_shards(training):
    sizes = (70, 17, 13)
    fn = DatasetFn(
        name="uneven",
        split="train",
        num_examples=sum(sizes),
        input_shape=(1, 1, 1),
        num_classes=1,
        source=UnevenSource(sizes),
    ).bind(global_batch_size=12, training=training)
    counts = [len(list(fn(ctx(3, i, 6)))) for i in range(3)]
    assert counts == [fn.steps_per_epoch() * 2] * 3
    assert fn.steps_per_epoch() == (8 if training else 9)
    if not training:  # the small shards are topped up with empty batches; none exceeds per_replica
        for i in range(3):
            evaluation_batches(
                fn(ctx(3, i, 6)), per_replica=2, expected_batches=18, input_shape=(1, 1, 1)
            )


def test_synthetic():
    train = load(
        "synthetic", num_examples=256, input_shape=(4, 4, 2), num_classes=5, global_batch_size=32
    )
    val = load(
        "synthetic", split="validation", num_examples=256, input_shape=(4, 4, 2), num_classes=5
    )
    assert train.input_shape == (4, 4, 2) and train.num_classes == 5 and train.num_examples == 256
    assert val.input_shape == (4, 4, 2) and val.num_classes == 5
    x, y = next(iter(train()))
    assert x.shape == (32, 4, 4, 2) and x.dtype == tf.float32 and y.dtype == tf.int32
    xt, yt = full_split("synthetic", "train")
    xv, _ = full_split("synthetic", "validation")
    assert not set(rows(xt)) & set(rows(xv))  # different seeds per split
    assert len(np.unique(yt)) == 10  # defaults: 10 classes, roughly balanced
    np.testing.assert_array_equal(full_split("synthetic", "train")[1], yt)  # deterministic
    # Learnable: a linear model on the flat features fits the labels.
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(max_iter=2000).fit(xt.reshape(len(xt), -1), yt)
    assert (
        clf.score(xv.reshape(len(xv), -1), full_split("synthetic", "validation")[1]) > 0.6
    )  # chance: 0.1


def test_unknown_dataset_split_and_kwargs():
    with pytest.raises(ValueError) as e:
        load("mnist")
    assert str(e.value) == (
        "Invalid value for argument `dataset`. Received: dataset='mnist'. "
        "Expected one of: digits, patterns, python_source, synthetic, tfds:NAME."
    )
    with pytest.raises(ValueError, match="Expected one of: train, validation, test, all"):
        load("digits", split="trian")
    with pytest.raises(
        ValueError, match="argument `split`.*Expected one of: train, validation, test"
    ):
        load("synthetic", split="all")
    with pytest.raises(ValueError, match="argument `num_classes`"):
        load("digits", num_classes=3)
    with pytest.raises(ValueError, match="argument `colour`"):
        load("synthetic", colour="red")
    with pytest.raises(ValueError, match=r"input_shape=\(32, 32\).*for dataset 'patterns'"):
        load("patterns", input_shape=(32, 32))
    with pytest.raises(ValueError, match="argument `num_examples`"):
        load("patterns", num_examples=0)


def _patterns(split, n):
    fn = load("patterns", split=split, num_examples=n, training=False, global_batch_size=n)
    ((x, y),) = list(fn())
    return x.numpy(), y.numpy()


def test_patterns_are_deterministic_and_their_class_is_the_motif_anywhere_in_the_image():
    fn = load("patterns", global_batch_size=32)
    assert (fn.input_shape, fn.num_classes, fn.num_examples) == ((32, 32, 3), 10, 4096)
    x, y = _patterns("validation", 200)
    assert x.shape == (200, 32, 32, 3) and x.dtype == np.float32 and y.dtype == np.int32
    assert set(y) == set(range(10))
    again = _patterns("validation", 200)
    np.testing.assert_array_equal(again[0], x)  # deterministic: fixed seeds, no download
    np.testing.assert_array_equal(again[1], y)
    xt, yt = _patterns("train", 1000)
    assert not set(rows(xt)) & set(rows(x))  # different seeds per split
    # Separable: the best match of each class's motif, over every place, names the class ...
    motifs = tfdist.data.arrays.pattern_motifs((32, 32, 3), 10)
    m = motifs.shape[1]
    places = 32 - m + 1
    match = np.zeros((len(x), places, places, 10))
    for i in range(m):
        for j in range(m):
            match += x[:, i : i + places, j : j + places, :] @ motifs[:, i, j, :].T
    assert np.mean(match.max(axis=(1, 2)).argmax(-1) == y) > 0.95
    # ... but not where it is: the nearest class mean of the pixels (a linear rule) is near
    # chance (0.1).
    means = np.stack([xt[yt == k].mean(0) for k in range(10)])
    nearest = ((x[:, None] - means[None]) ** 2).sum(axis=(2, 3, 4)).argmin(1)
    assert np.mean(nearest == y) < 0.3


# --- tfds ------------------------------------------------------------------------------------
# The installed tensorflow-datasets ships no dataset metadata files, and without them
# `tfds.testing.mock_data` (MockPolicy.USE_CODE) leaves `info.splits` empty, so split sizes are
# unknown. The fixture writes real metadata for "mnist" (features from its builder code, split sizes
# chosen here) into a temporary data_dir and mocks with MockPolicy.USE_FILES. No download happens.
# Note that mock_data yields `num_examples` generated examples per as_dataset call and ignores the
# ReadConfig's input_context, so every pipeline receives the whole mock split before our sharding.

TFDS_TRAIN, TFDS_TEST = 96, 40


@pytest.fixture(scope="module")
def tfds_mnist_dir(tmp_path_factory):
    tfds = pytest.importorskip("tensorflow_datasets")
    root = tmp_path_factory.mktemp("tfds")
    builder = tfds.builder("mnist", data_dir=str(root))
    template = tfds.core.ShardedFileTemplate(
        data_dir=builder.data_path, dataset_name="mnist", filetype_suffix="tfrecord"
    )
    builder.info.set_splits(
        tfds.core.SplitDict(
            [
                tfds.core.SplitInfo(
                    name="train",
                    shard_lengths=[50, 30, 16],
                    num_bytes=0,
                    filename_template=template.replace(split="train"),
                ),
                tfds.core.SplitInfo(
                    name="test",
                    shard_lengths=[TFDS_TEST],
                    num_bytes=0,
                    filename_template=template.replace(split="test"),
                ),
            ]
        )
    )
    builder.data_path.mkdir(parents=True)
    builder.info.write_to_directory(builder.data_path)
    return str(root)


@pytest.fixture
def mock_mnist(tfds_mnist_dir):
    import tensorflow_datasets as tfds

    def mock(num_examples):
        return tfds.testing.mock_data(
            num_examples=num_examples,
            data_dir=tfds_mnist_dir,
            policy=tfds.testing.MockPolicy.USE_FILES,
        )

    return mock


def test_tfds_metadata_and_training_batches(mock_mnist):
    with mock_mnist(TFDS_TRAIN):
        fn = load("tfds:mnist", split="train", global_batch_size=16)
        assert (fn.num_examples, fn.input_shape, fn.num_classes) == (TFDS_TRAIN, (28, 28, 1), 10)
        assert fn.training and fn.steps_per_epoch() == 6
        counts = []
        for i in range(2):  # 3 files >= 2 pipelines: FILE sharding through tfds.ReadConfig
            batches = list(fn(ctx(2, i, 4)))
            counts.append(len(batches))
            for x, y in batches:
                assert x.shape == (4, 28, 28, 1) and x.dtype == tf.float32 and y.dtype == tf.int32
                assert 0.0 <= float(tf.reduce_min(x)) and float(tf.reduce_max(x)) <= 1.0
        assert counts == [6 * 2, 6 * 2]


def test_tfds_validation_maps_to_test_and_counts_each_example_once(mock_mnist):
    with mock_mnist(TFDS_TEST):
        fn = load("tfds:mnist", split="validation", global_batch_size=12)
        assert fn.split == "test" and not fn.training and fn.num_examples == TFDS_TEST
        shards, sizes = [], []
        for i in range(3):  # evaluation shards by example (DATA): 14, 13 and 13 of the 40
            xs, _, s = evaluation_batches(
                fn(ctx(3, i, 6)),
                per_replica=2,
                expected_batches=fn.steps_per_epoch() * 2,
                input_shape=(28, 28, 1),
            )
            assert (
                len(s) == 8 and s[-1] == 0
            )  # 4 steps * 2 replicas per pipeline; the last is a top-up
            shards.append(xs)
            sizes.append(s)
        assert sum(map(sum, sizes)) == TFDS_TEST  # counted by batch sizes
        assert sorted(map(sum, sizes)) == [13, 13, 14]
        for a in range(3):
            for b in range(a + 1, 3):
                assert not set(shards[a]) & set(shards[b])
        ((x_all, _),) = list(
            fn.bind(global_batch_size=1000)()
        )  # mock data is the same on every call
        assert sorted(r for shard in shards for r in shard) == sorted(rows(x_all))


def test_tfds_errors(mock_mnist, tmp_path):
    with mock_mnist(8):
        with pytest.raises(ValueError, match=r"argument `split`.*Expected one of: test, train"):
            load("tfds:mnist", split="dev")
        with pytest.raises(ValueError, match="argument `num_examples`"):
            load("tfds:mnist", num_examples=3)
    with pytest.raises(ValueError, match="argument `dataset`.*tfds:NAME"):
        load("tfds:no_such_dataset_anywhere")
    with pytest.raises(ValueError) as e:
        load("tfds:mnist", data_dir=str(tmp_path))  # not prepared there, and never downloaded
    msg = str(e.value)
    assert (
        "argument `data_dir`" in msg
        and str(tmp_path) in msg
        and "downloads nothing at run time" in msg
    )
    assert not any(tmp_path.rglob("*.tfrecord*"))


@pytest.mark.parametrize(
    "per_replica", [32, 25]
)  # 360 examples: 32 ends partial, 25 also tops up an empty batch
def test_distribute_datasets_from_function_under_mirrored(per_replica):
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:4]
    strategy = tf.distribute.MirroredStrategy(devices)
    fn = load("digits", split="validation", global_batch_size=per_replica * len(devices))
    dist = strategy.distribute_datasets_from_function(fn)
    steps, examples, local_sizes = 0, 0, []
    for x, _ in dist:
        steps += 1
        local_sizes += [int(t.shape[0]) for t in strategy.experimental_local_results(x)]
        assert all(t.shape[1:] == (8, 8, 1) for t in strategy.experimental_local_results(x))
        batch_size = strategy.run(lambda x: tf.shape(x)[0], args=(x,))
        examples += int(strategy.reduce("SUM", batch_size, axis=None))
    assert steps == fn.steps_per_epoch() and examples == fn.num_examples
    assert len(local_sizes) == steps * len(devices) and max(local_sizes) == per_replica
    if per_replica == 25:
        assert local_sizes[-1] == 0  # 14 full + 10 + one empty top-up batch
