"""The "python_source" dataset: the running interpreter's standard library, as byte tokens.

Real text that every machine has, with no download: the ``.py`` files under
``sysconfig.get_paths()["stdlib"]`` (``site-packages`` and ``dist-packages`` left out), read
as bytes. Each byte is a token (a vocabulary of 256) and its target is the next byte: the
examples are non-overlapping windows of ``seq_len + 1`` bytes, ``x = window[:-1]``,
``y = window[1:]``, both int32 of shape ``(seq_len,)``.

Files, not windows, are split: a file is in "validation" when a stable hash of its relative
path (SHA-256, not Python's salted ``hash``) falls in one of `VALIDATION_ONE_IN` buckets, so no
file's text is in both splits and the split is the same in every process and on every
machine. A split's files are concatenated in the order of that hash (a fixed pseudo-random
order, so that a ``max_bytes`` prefix samples many modules, not the alphabet's first ones) and
the windows cut from the concatenation; training shuffles the windows with the seed like any
in-memory dataset (`tfdist.data.dataset_fn.DatasetFn`).

Interpreters differ (Python 3.11.7 here: 31.5 MB in 1,790 files), so the first read logs the
corpus's size and a digest of its bytes; the files are read once per process and kept in
memory.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import sys
import sysconfig
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist.config import check_positive_int, invalid_argument
from tfdist.data.dataset_fn import DatasetFn

logger = logging.getLogger(__name__)

PYTHON_SOURCE_SPLITS = ("train", "validation", "test")  # "test" is an alias of "validation"
#: About one file in this many is a validation file.
VALIDATION_ONE_IN = 20
#: Tokens are bytes.
VOCABULARY_SIZE = 256
DEFAULT_SEQ_LEN = 128
#: Bytes of each split used when ``max_bytes`` is not given: enough text for a small GPT to
#: learn in a few minutes on 2 CPU cores, and a validation set that is quick to evaluate.
DEFAULT_MAX_BYTES = {"train": 2 * 2**20, "validation": 256 * 2**10}
_SKIPPED_DIRS = ("site-packages", "dist-packages")
_DEFAULT: Any = object()  # max_bytes not given: DEFAULT_MAX_BYTES of the split


@dataclasses.dataclass(frozen=True, eq=False)
class Corpus:
    """The standard library's ``.py`` files: relative paths, sorted, and their bytes."""

    root: str
    paths: tuple[str, ...]
    texts: tuple[bytes, ...]
    digest: str  # the first 12 hex digits of SHA-256 over every (path, bytes), in path order

    @property
    def num_bytes(self) -> int:
        return sum(len(t) for t in self.texts)


def _source_paths(root: str) -> list[str]:
    paths = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _SKIPPED_DIRS and d != "__pycache__"]
        rel = os.path.relpath(folder, root)
        paths += [os.path.normpath(os.path.join(rel, f)) for f in files if f.endswith(".py")]
    return sorted(p.replace(os.sep, "/") for p in paths)


@functools.lru_cache(maxsize=1)
def corpus() -> Corpus:
    """Reads the running interpreter's standard library once per process; logs size and digest."""
    root = sysconfig.get_paths()["stdlib"]
    paths, texts = [], []
    digest = hashlib.sha256()
    for path in _source_paths(root):
        try:
            with open(os.path.join(root, path), "rb") as f:
                text = f.read()
        except OSError:  # a broken link or an unreadable file: not part of the corpus
            continue
        paths.append(path)
        texts.append(text)
        digest.update(f"{path}\0{len(text)}\0".encode())
        digest.update(text)
    if not texts:
        raise invalid_argument(
            "dataset",
            "python_source",
            "a Python installation whose standard library has .py files",
            note=f"No .py file was found under {root!r}.",
        )
    result = Corpus(root, tuple(paths), tuple(texts), digest.hexdigest()[:12])
    logger.info(
        "python_source: %d bytes in %d files of Python %s's standard library at %s, digest %s.",
        result.num_bytes,
        len(paths),
        sys.version.split()[0],
        root,
        result.digest,
    )
    return result


def _file_key(path: str) -> int:
    return int.from_bytes(hashlib.sha256(path.encode()).digest()[:8], "big")


def is_validation_file(path: str) -> bool:
    """Whether the file at this relative path is in the validation split (a stable hash)."""
    return _file_key(path) % VALIDATION_ONE_IN == 0


def split_files(split: str) -> list[str]:
    """The relative paths of a split's files, in the order they are concatenated."""
    validation = split != "train"
    return sorted((p for p in corpus().paths if is_validation_file(p) == validation), key=_file_key)


@functools.lru_cache(maxsize=8)
def split_windows(split: str, seq_len: int, max_bytes: int | None) -> np.ndarray:
    """A split's ("train" or "validation") windows: read-only uint8 ``(n, seq_len + 1)``.

    Cached per process (``max_bytes`` None: the whole split).
    """
    texts = dict(zip(corpus().paths, corpus().texts))
    chunks, size = [], 0
    for path in split_files(split):
        if max_bytes is not None and size >= max_bytes:
            break
        chunks.append(texts[path])
        size += len(texts[path])
    data = b"".join(chunks)[:max_bytes]
    n = len(data) // (seq_len + 1)
    windows = np.frombuffer(data, np.uint8, count=n * (seq_len + 1)).reshape(n, seq_len + 1)
    windows.setflags(write=False)
    return windows


def _next_byte(window: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    window = tf.cast(window, tf.int32)
    return window[:-1], window[1:]


@dataclasses.dataclass(frozen=True, eq=False)
class TextSource:
    """Windows of bytes in memory, as ``(x, y)`` next-byte pairs (``whole_split``, as arrays)."""

    windows: np.ndarray
    whole_split = True

    def examples(
        self, input_context: tf.distribute.InputContext, *, training: bool, seed: int
    ) -> tf.data.Dataset:
        del training, seed  # Shuffling happens in DatasetFn.
        p, i = input_context.num_input_pipelines, input_context.input_pipeline_id
        ds = tf.data.Dataset.from_tensor_slices(self.windows[i::p])
        return ds.map(_next_byte, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def load_python_source(
    split: str, *, seq_len: int = DEFAULT_SEQ_LEN, max_bytes: int | None = _DEFAULT
) -> DatasetFn:
    """The standard library's source as next-byte windows (see the module docstring).

    Args:
        split: "train", "validation" or "test" (= "validation").
        seq_len: Tokens (bytes) per example.
        max_bytes: Bytes of the split's text to use, from the start of its files' fixed order;
            None for all of it. Not given: `DEFAULT_MAX_BYTES` of the split.

    Returns:
        An unbound `DatasetFn` with ``input_shape=(seq_len,)`` and ``num_classes=256``.
    """
    if split not in PYTHON_SOURCE_SPLITS:
        raise invalid_argument("split", split, PYTHON_SOURCE_SPLITS)
    check_positive_int("seq_len", seq_len)
    canonical = "train" if split == "train" else "validation"
    if max_bytes is _DEFAULT:
        max_bytes = DEFAULT_MAX_BYTES[canonical]
    if max_bytes is not None and (
        isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= seq_len
    ):
        raise invalid_argument(
            "max_bytes",
            max_bytes,
            f"None (all the text) or an int of at least seq_len + 1 ({seq_len + 1}) bytes",
        )
    windows = split_windows(canonical, seq_len, max_bytes)
    if not len(windows):
        raise invalid_argument(
            "seq_len",
            seq_len,
            "a length shorter than the split's text",
            note=f"Split {split!r} of 'python_source' has fewer than seq_len + 1 bytes.",
        )
    return DatasetFn(
        name="python_source",
        split=split,
        num_examples=len(windows),
        input_shape=(seq_len,),
        num_classes=VOCABULARY_SIZE,
        source=TextSource(windows),
    )
