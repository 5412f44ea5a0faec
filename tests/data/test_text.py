"""Tests for tfdist.data.text: "python_source", the standard library as next-byte windows."""

import logging

import numpy as np
import pytest
import tensorflow as tf

from tfdist.data import load, text

SEQ = 16
SMALL = 8 * 1024  # bytes: 481 windows of 17


def batches(fn, count):
    return [(x.numpy(), y.numpy()) for x, y in fn().take(count)]


def test_examples_are_next_byte_windows_of_the_split_text():
    fn = load("python_source", split="validation", seq_len=SEQ, max_bytes=SMALL)
    assert (fn.input_shape, fn.num_classes) == ((SEQ,), 256)
    assert fn.num_examples == SMALL // (SEQ + 1)
    x, y = batches(fn.bind(global_batch_size=64), 1)[0]
    assert x.dtype == y.dtype == np.int32 and x.shape == y.shape == (64, SEQ)
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])  # y is x shifted by one byte
    # Evaluation is unshuffled: the windows cut the split's files, concatenated in their order.
    corpus = dict(zip(text.corpus().paths, text.corpus().texts))
    data = b"".join(corpus[p] for p in text.split_files("validation"))[: 64 * (SEQ + 1)]
    windows = np.frombuffer(data, np.uint8).reshape(64, SEQ + 1)
    np.testing.assert_array_equal(x, windows[:, :-1])
    np.testing.assert_array_equal(y, windows[:, 1:])


def test_two_loads_give_the_same_batches():
    def first_batches(split, seed):
        fn = load("python_source", split=split, seq_len=SEQ, max_bytes=SMALL, seed=seed)
        return batches(fn.bind(global_batch_size=32), 3)

    for split in ("train", "validation"):
        a, b = first_batches(split, 0), first_batches(split, 0)
        for (xa, ya), (xb, yb) in zip(a, b):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)
    # Training shuffles the windows with the seed; evaluation keeps their order.
    assert not np.array_equal(first_batches("train", 0)[0][0], first_batches("train", 1)[0][0])
    validation = load("python_source", split="test", seq_len=SEQ, max_bytes=SMALL)
    assert validation.split == "test" and not validation.training
    np.testing.assert_array_equal(
        batches(validation.bind(global_batch_size=32), 1)[0][0],
        first_batches("validation", 0)[0][0],
    )


def test_the_split_is_by_file_and_stable():
    train, validation = text.split_files("train"), text.split_files("validation")
    assert validation and not set(train) & set(validation)
    assert sorted(train + validation) == list(text.corpus().paths)
    assert 0.02 < len(validation) / len(text.corpus().paths) < 0.1  # about 1 in 20
    assert all(not p.startswith(("site-packages", "dist-packages")) for p in train)
    assert text.is_validation_file(validation[0]) and not text.is_validation_file(train[0])


def test_max_bytes_bounds_the_split_and_none_takes_all_of_it():
    small = load("python_source", split="validation", seq_len=SEQ, max_bytes=SMALL)
    whole = load("python_source", split="validation", seq_len=SEQ, max_bytes=None)
    size = sum(
        len(t)
        for p, t in zip(text.corpus().paths, text.corpus().texts)
        if text.is_validation_file(p)
    )
    assert whole.num_examples == size // (SEQ + 1) > small.num_examples
    default = load("python_source", split="train")
    assert default.input_shape == (text.DEFAULT_SEQ_LEN,)
    assert default.num_examples == text.DEFAULT_MAX_BYTES["train"] // (text.DEFAULT_SEQ_LEN + 1)


def test_the_corpus_is_read_and_logged_once(caplog):
    text.corpus.cache_clear()
    text.split_windows.cache_clear()  # the windows, cached too, would not read the corpus again
    with caplog.at_level(logging.INFO, logger="tfdist.data.text"):
        for split in ("train", "validation"):
            load("python_source", split=split, seq_len=SEQ, max_bytes=SMALL)
    (record,) = [r for r in caplog.records if r.name == "tfdist.data.text"]
    corpus = text.corpus()
    assert f"{corpus.num_bytes} bytes in {len(corpus.paths)} files" in record.getMessage()
    assert corpus.digest in record.getMessage() and len(corpus.digest) == 12


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(seq_len=0), "seq_len"),
        (dict(seq_len=8.0), "seq_len"),
        (dict(max_bytes=8), "max_bytes"),
        (dict(max_bytes=True), "max_bytes"),
        (dict(split="all"), "split"),
        (dict(num_examples=5), "num_examples"),
    ],
)
def test_bad_options_name_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=f"Invalid value for argument `{argument}`"):
        load("python_source", **kwargs)


def test_pipelines_of_a_sharded_evaluation_see_every_window_once():
    fn = load("python_source", split="validation", seq_len=SEQ, max_bytes=SMALL)
    fn = fn.bind(global_batch_size=64)
    seen = []
    for i in range(2):
        context = tf.distribute.InputContext(2, i, 2)
        seen += [r.tobytes() for x, _ in fn(context) for r in x.numpy()]
    windows = text.split_windows("validation", SEQ, SMALL)
    assert sorted(seen) == sorted(w[:-1].tobytes() for w in windows.astype(np.int32))
