"""Trainer.fit against Keras fit: the two sides, their data, weights and timing.

Both sides get the same strategy, model (from identical weights), data and
options; only the loop differs: ``tfdist.Trainer(...).fit`` vs
``model.compile(...)`` + ``model.fit`` inside ``strategy.scope()``. The local-SGD sides of
``scaling`` and ``time_to_accuracy`` are named and built here (`local_sgd_option`).
"""

from __future__ import annotations

import contextlib
import io
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import keras
import numpy as np
import tensorflow as tf

import tfdist
from tfdist.bench.harness.timing import Samples, Stopwatch, Timing, median, ratio
from tfdist.config import invalid_argument


def make_dataset(
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    global_batch_size: int,
    num_batches: int,
    seed: int = 0,
) -> tf.data.Dataset:
    """An in-memory, repeated ``tf.data.Dataset`` of ``num_batches`` distinct global batches.

    Random features and labels: throughput does not depend on what is learned.
    """
    rng = np.random.default_rng(seed)
    n = global_batch_size * num_batches
    x = rng.normal(size=(n, *input_shape)).astype("float32")
    y = rng.integers(0, num_classes, size=(n,)).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size, drop_remainder=True)
    return ds.cache().repeat().prefetch(tf.data.AUTOTUNE)


#: The CNN the in-process benches train (accumulation, backup, trainer_vs_fit): 8x8x1 inputs,
#: 10 classes, SGD(0.01), a global batch of 256 (32 in a quick run, with 8 steps per fit).
CNN_INPUT_SHAPE = (8, 8, 1)
CNN_CLASSES = 10
CNN_GLOBAL_BATCH_SIZE = 256
CNN_LEARNING_RATE = 0.01


class CnnRun(NamedTuple):
    """A bench's CNN work: its global batch, steps per timed fit, data and seeded builder."""

    global_batch_size: int
    steps: int
    dataset: tf.data.Dataset
    builder: Callable[[], keras.Model]

    def config(self, strategy: tf.distribute.Strategy) -> dict[str, Any]:
        """The JSON ``config`` entries every CNN bench reports."""
        return {
            "strategy": "mirrored",
            "num_replicas": strategy.num_replicas_in_sync,
            "model": "cnn",
            "input_shape": list(CNN_INPUT_SHAPE),
            "num_classes": CNN_CLASSES,
            "global_batch_size": self.global_batch_size,
            "optimizer": f"SGD({CNN_LEARNING_RATE})",
        }


def cnn_run(quick: bool, steps: int) -> CnnRun:
    """The bench CNN, its in-memory data (8 distinct global batches) and ``steps`` per fit."""
    import tfdist

    global_batch_size = 32 if quick else CNN_GLOBAL_BATCH_SIZE
    dataset = make_dataset(
        CNN_INPUT_SHAPE, CNN_CLASSES, global_batch_size=global_batch_size, num_batches=8
    )

    def build() -> keras.Model:
        return tfdist.models.get("cnn", input_shape=CNN_INPUT_SHAPE, num_classes=CNN_CLASSES)

    return CnnRun(global_batch_size, 8 if quick else steps, dataset, seeded(build))


def initial_weights(build: Callable[[], keras.Model], seed: int = 0) -> list[np.ndarray]:
    """The weights ``build()`` starts from under ``seed`` (built outside any strategy)."""
    keras.utils.set_random_seed(seed)
    return build().get_weights()


def seeded(build: Callable[[], keras.Model], seed: int = 0) -> Callable[[], keras.Model]:
    """A zero-arg builder whose every model starts from the same weights (``build`` under ``seed``).

    Each side of a comparison gets its own model from it, all from the same start.
    """
    return with_weights(build, initial_weights(build, seed))


def with_weights(
    build: Callable[[], keras.Model], weights: list[np.ndarray]
) -> Callable[[], keras.Model]:
    """A zero-arg builder that builds the model and loads ``weights``."""

    def builder() -> keras.Model:
        model = build()
        model.set_weights(weights)
        return model

    return builder


def logits_loss() -> keras.losses.Loss:
    """The loss of every benchmark: sparse categorical cross-entropy on logits."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class _Window(keras.callbacks.Callback):
    """Times from a start its subclass marks to the epoch's end (results fetched)."""

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.watch: Stopwatch | None = None
        self.timing: Timing | None = None

    def _start(self) -> None:
        if self.watch is None:
            self.watch = Stopwatch()
            self.watch.start()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.timing = self.watch.stop()  # both loops fetch the last step's logs before this


class _StepWindow(_Window):
    """From the first batch's start."""

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._start()


class _EpochWindow(_Window):
    """From the epoch's start, with no batch hook: a Trainer's ``steps_per_execution="auto"``
    (one update per call for callbacks with batch hooks) stays what it is without the
    timing. The Trainer makes the epoch's iterator before ``on_epoch_begin``, so this
    window holds its steps and the metrics' reset only.
    """

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._start()


class FitThroughput:
    """A measurement: one ``fit(epochs=1, steps_per_epoch=steps)`` call, in examples/s.

    Only the steps are timed, from the first batch's start to the epoch's end.
    The rest of the call (iterator creation, and destruction, which with
    ``tf.distribute`` datasets can stall for up to seconds on this TF) is kept
    apart in `overheads`. The timing callback overrides no
    ``on_*_batch_end`` hook, so it changes nothing in how either loop
    dispatches its steps.

    Args:
        fit: ``fit(epochs=, steps_per_epoch=, verbose=, callbacks=)`` of one side.
        steps: Batches per call.
        global_batch_size: Examples per batch.
        iterations: Zero-arg callable reading the side's optimizer update
            count; when given, `updates` records the updates each call
            made, so that a comparison can show both sides did the same work.
        from_epoch_begin: Start the window at ``on_epoch_begin`` instead of the
            first batch, so that no batch hook changes a tfdist Trainer's
            ``steps_per_execution="auto"`` (Keras's fit makes its iterator after
            ``on_epoch_begin``: keep the default for it).
    """

    def __init__(
        self,
        fit: Callable[..., Any],
        *,
        steps: int,
        global_batch_size: int,
        iterations: Callable[[], int] | None = None,
        from_epoch_begin: bool = False,
    ) -> None:
        self.fit = fit
        self.window = _EpochWindow if from_epoch_begin else _StepWindow
        self.steps = steps
        self.global_batch_size = global_batch_size
        self.iterations = iterations
        self.overheads: list[float] = []
        self.updates: list[int] = []

    def __call__(self) -> tuple[float, Timing]:
        window = self.window()
        before = self.iterations() if self.iterations is not None else None
        start = time.perf_counter()
        self.fit(epochs=1, steps_per_epoch=self.steps, verbose=0, callbacks=[window])
        total = time.perf_counter() - start
        self.overheads.append(total - window.timing.seconds)
        if before is not None:
            self.updates.append(self.iterations() - before)
        return self.steps * self.global_batch_size / window.timing.seconds, window.timing


def compiled_in_scope(
    strategy: tf.distribute.Strategy,
    builder: Callable[[], keras.Model],
    optimizer: Callable[[], keras.optimizers.Optimizer],
    metrics: Sequence[str] = (),
    steps_per_execution: int = 1,
) -> keras.Model:
    """Plain Keras: ``builder()`` in the strategy's scope, compiled with the bench's loss.

    ``optimizer`` is a factory, called in the scope too: an optimizer made outside it keeps
    an ``iterations`` counter that every replica increments.
    """
    with strategy.scope():
        model = builder()
        model.compile(
            optimizer=optimizer(),
            loss=logits_loss(),
            metrics=list(metrics),
            steps_per_execution=steps_per_execution,
        )
    return model


def fit_sides(
    strategy: tf.distribute.Strategy,
    builder: Callable[[], keras.Model],
    dataset: tf.data.Dataset,
    *,
    global_batch_size: int,
    steps: int,
    optimizer: Callable[[], keras.optimizers.Optimizer],
    metrics: Sequence[str] = (),
    steps_per_execution: int = 1,
) -> dict[str, FitThroughput]:
    """The two sides, "trainer" and "keras_fit", each warmed up untimed once (`warm_up`).

    Args:
        strategy: The strategy both sides train under.
        builder: Zero-arg model builder, called once per side in scope; it
            should load fixed weights so that both sides start alike.
        dataset: Repeated ``tf.data.Dataset`` of global batches.
        global_batch_size: Examples per global batch of ``dataset``.
        steps: Batches per timed ``fit`` call.
        optimizer: Zero-arg optimizer factory (one optimizer per side).
        metrics: Compiled metrics of both sides.
        steps_per_execution: For both sides.
    """
    import tfdist

    trainer = tfdist.Trainer(
        builder,
        strategy=strategy,
        optimizer=optimizer(),
        loss=logits_loss(),
        metrics=list(metrics),
        steps_per_execution=steps_per_execution,
    )
    model = compiled_in_scope(strategy, builder, optimizer, metrics, steps_per_execution)

    def keras_fit(**kwargs: Any) -> Any:
        # Keras never shuffles a Dataset; shuffle=False only mutes its warning.
        return model.fit(dataset, shuffle=False, **kwargs)

    return {
        "trainer": trainer_side(trainer, dataset, global_batch_size=global_batch_size, steps=steps),
        "keras_fit": warm_up(
            FitThroughput(
                keras_fit,
                steps=steps,
                global_batch_size=global_batch_size,
                iterations=lambda: int(model.optimizer.iterations.numpy()),
            )
        ),
    }


def warm_up(side: FitThroughput) -> FitThroughput:
    """Runs one untimed call (traces, fills the dataset cache) and forgets its overhead."""
    side()
    side.overheads.clear()
    side.updates.clear()
    return side


def trainer_side(
    trainer: Any, data: Any, *, global_batch_size: int, steps: int, verbose: int = 0
) -> FitThroughput:
    """A warmed-up measurement of ``trainer.fit(data, epochs=1, steps_per_epoch=steps)``.

    Args:
        trainer: A ``tfdist.Trainer``.
        data: Anything ``Trainer.fit`` takes (a dataset of global batches, a dataset_fn, ...).
        global_batch_size: Examples per batch (per micro-batch with accumulation).
        steps: Batches (micro-batches) per timed call.
        verbose: The fits' ``verbose``; at 1 Keras's progress bar is drawn into a string
            (what a user's default ``fit`` costs, without filling the bench's output).
    """

    def fit(**kwargs: Any) -> Any:
        shown = contextlib.redirect_stdout(io.StringIO()) if verbose else contextlib.nullcontext()
        with shown:
            return trainer.fit(
                data, global_batch_size=global_batch_size, **{**kwargs, "verbose": verbose}
            )

    return warm_up(
        FitThroughput(
            fit,
            steps=steps,
            global_batch_size=global_batch_size,
            iterations=lambda: int(trainer.model.optimizer.iterations.numpy()),
        )
    )


def fit_summary(samples: Samples, sides: Mapping[str, FitThroughput]) -> dict[str, Any]:
    """Median examples/s of "trainer" and "keras_fit", their ratio and median per-call overheads."""
    trainer_rate = samples.median("trainer")
    keras_rate = samples.median("keras_fit")
    return {
        "trainer_examples_per_s": trainer_rate,
        "keras_fit_examples_per_s": keras_rate,
        "ratio": ratio(trainer_rate, keras_rate),
        "fit_overhead_s": {name: median(side.overheads) for name, side in sides.items()},
        # The optimizer updates each timed call made, per side: equal when both did the same work.
        "updates_per_call": {name: list(side.updates) for name, side in sides.items()},
    }


#: A local-SGD side's name: ``local_sgd_h<H>`` (a parameter average every H updates) or
#: ``diloco_h<H>`` (the averaged change to DiLoCo's outer SGD(0.7, Nesterov momentum 0.9));
#: ``diloco_h<H>_lr<rate>_m<momentum>`` another outer SGD (``m0.9n``: Nesterov; so
#: ``diloco_h16_lr0.7_m0.9n`` is ``diloco_h16`` and ``diloco_h16_lr1_m0`` plain averaging); a
#: ``_k<K>`` part (streaming DiLoCo, ``LocalSGDOptions(fragments=K)``: K fragments synced in
#: turn, K a divisor of H, so ``diloco_h16_k4``) comes next; a ``_linear`` suffix puts the inner
#: optimizer on the linear LR rule with warmup (as the synchronous ``linear`` side); an
#: ``_adapt`` suffix (after ``_linear``) adapts to stragglers
#: (``LocalSGDOptions(adapt_to_stragglers=True)``; the Trainer then needs ``stragglers=None``;
#: not beside ``_k<K>``, K > 1). `local_side` reads one.
LOCAL_SIDE = re.compile(
    r"(?P<kind>local_sgd|diloco)_h(?P<every>[1-9][0-9]*)"
    r"(?:_lr(?P<rate>[0-9]+(?:\.[0-9]+)?)_m(?P<momentum>0(?:\.[0-9]+)?)(?P<nesterov>n?))?"
    r"(?:_k(?P<fragments>[1-9][0-9]*))?(?P<linear>_linear)?(?P<adapt>_adapt)?"
)
#: The outer SGD of a ``diloco_h<H>`` side with no ``_lr.._m..`` (the DiLoCo paper's).
DILOCO_OUTER = (0.7, 0.9, True)


class LocalSide(NamedTuple):
    """A local-SGD side's settings, read off its name (`LOCAL_SIDE`)."""

    sync_every: int
    #: The outer SGD's (rate, momentum, nesterov); None: plain averaging.
    outer: tuple[float, float, bool] | None
    #: Whether the inner optimizer runs on the linear LR rule with warmup.
    linear: bool
    #: Whether a slower worker takes fewer inner steps a round (``adapt_to_stragglers``).
    adapt: bool = False
    #: ``K``, the fragments synced in turn (streaming DiLoCo; 1: the whole model each sync).
    fragments: int = 1

    def refusal(self) -> str | None:
        """Why ``LocalSGDOptions`` would refuse these settings, or None: ``K`` not dividing
        ``H``, or ``K > 1`` beside ``_adapt``."""
        if self.sync_every % self.fragments:
            return f"_k<K> a divisor of H (K={self.fragments}, H={self.sync_every})"
        if self.fragments > 1 and self.adapt:
            return "_k<K> with K = 1 beside _adapt (each worker's steps weigh a whole round)"
        return None


def local_side(name: Any) -> LocalSide | None:
    """The settings of local-SGD side ``name``, or None when it is not one (`LOCAL_SIDE`;
    ``_lr.._m..`` only after ``diloco``)."""
    found = LOCAL_SIDE.fullmatch(name) if isinstance(name, str) else None
    if found is None or (found["kind"] == "local_sgd" and found["rate"] is not None):
        return None
    outer = None
    if found["kind"] == "diloco":
        outer = DILOCO_OUTER
        if found["rate"] is not None:
            outer = (float(found["rate"]), float(found["momentum"]), bool(found["nesterov"]))
    k = int(found["fragments"] or 1)
    return LocalSide(int(found["every"]), outer, bool(found["linear"]), bool(found["adapt"]), k)


def check_local_sides(
    names: Any, linear: bool = False, adapt: bool = False, argument: str = "local_sgd"
) -> tuple[str, ...]:
    """``names`` (the ``local_sgd`` option of a benchmark) as a tuple, each a `LOCAL_SIDE`.

    Args:
        names: The side names.
        linear: Whether the benchmark applies a ``_linear`` suffix (``time_to_accuracy``);
            the others refuse it.
        adapt: Whether the benchmark runs an ``_adapt`` suffix (``time_to_accuracy``, whose
            Trainers then take ``stragglers=None``); the others refuse it.
        argument: The option's name in the error.

    Raises:
        ValueError: Naming ``argument`` (``local_sgd``), for a name that is not one, or whose
            ``_k<K>`` does not divide ``H`` or stands beside ``_adapt`` (before anything
            launches).
    """
    names = tuple(names)
    expected = "local_sgd_h<H> or diloco_h<H>[_lr<rate>_m<momentum>[n]], H >= 1, then _k<K>"
    suffixes = [s for s, taken in (("_linear", linear), ("_adapt", adapt)) if taken]
    if suffixes:
        expected += ", each optionally ending in " + " then ".join(suffixes)
    for name in names:
        side = local_side(name)
        if side is None or (side.linear and not linear) or (side.adapt and not adapt):
            raise invalid_argument(argument, name, expected)
        if side.refusal():
            raise invalid_argument(argument, name, side.refusal())
    return names


def local_sgd_option(name: str) -> Any:
    """The ``tfdist.LocalSGDOptions`` of a `LOCAL_SIDE` name (its ``_linear`` is the caller's:
    an LR rule of the inner optimizer; ``_adapt``: ``adapt_to_stragglers=True``; ``_k<K>``:
    ``fragments=K``)."""
    side = local_side(name)
    if side is None or side.refusal():
        check_local_sides([name], linear=True, adapt=True)
    outer = None
    if side.outer is not None:
        rate, momentum, nesterov = side.outer
        outer = keras.optimizers.SGD(rate, momentum=momentum, nesterov=nesterov)
    return tfdist.LocalSGDOptions(
        sync_every=side.sync_every,
        outer_optimizer=outer,
        adapt_to_stragglers=side.adapt,
        fragments=side.fragments,
    )


def sync_counts(before: int, after: int, sync_every: int, fragments: int = 1) -> tuple[int, int]:
    """The syncs of a fit from update ``before`` to ``after``: those of whole rounds (each
    multiple of ``sync_every`` passed; with ``fragments=K``, one fragment's at each multiple
    of ``sync_every / K``), and the fit's end's (1 when it ended between them: a fit ends on a
    sync, of every fragment mid-round, so always with ``K > 1``; else 0)."""
    step = sync_every // fragments
    return after // step - before // step, int(fragments > 1 or after % sync_every != 0)


def fragment_bytes(model: keras.Model, name: str) -> list[int]:
    """The bytes each sync of local side ``name`` averages on ``model``, fragment by fragment
    (one entry: the whole model, without ``_k<K>``): the Trainer's own cut
    (`tfdist.training.local_sgd.fragments.split`: the trainable variables and the float
    statistics, in model order), recomputed from the model, no Trainer internals read."""
    from tfdist.training.local_sgd import fragments

    side = local_side(name)
    statistics = [v for v in model.non_trainable_weights if tf.as_dtype(v.dtype).is_floating]
    cut = fragments.split(
        model, list(model.trainable_variables), statistics, side.fragments, side.sync_every
    )
    return [f.bytes for f in cut]


def sync_bytes(
    before: int, after: int, sync_every: int, fragment_bytes: Sequence[int]
) -> tuple[int, int]:
    """The bytes a fit from update ``before`` to ``after`` hands the all-reduce on a local side
    of ``len(fragment_bytes)`` fragments (`fragment_bytes`; K = 1: the model's): those of its
    scheduled syncs (fragment ``j`` at the updates ``t`` with ``t % H`` its offset), and its
    end's (every fragment that did not sync at update ``after``); ``sync_counts``' syncs
    weighed by the bytes each carries."""
    from tfdist.training.local_sgd.fragments import offset

    k, before, after = len(fragment_bytes), int(before), int(after)
    offsets = [offset(j, k, sync_every) for j in range(k)]
    step = sync_every // k
    scheduled = [t % sync_every for t in range(before + 1, after + 1) if t % step == 0]
    end = [b for b, o in zip(fragment_bytes, offsets) if after % sync_every != o]
    return sum(fragment_bytes[offsets.index(o)] for o in scheduled), sum(end)


def local_bytes(
    name: str,
    updates: Sequence[int],
    model_bytes: float,
    workers: int,
    fragment_bytes: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Local side ``name``'s bytes over fits of ``updates`` updates each, from update 0 (each
    worker's share of the all-reduce; a ring sends ``2 (N-1) / N`` of it; 0 on one worker):

    * ``allreduce_bytes_per_update``: every sync of a fit (`sync_bytes`), its end's included,
      over its updates (median over the fits);
    * ``steady_allreduce_bytes_per_update``: whole rounds only, the model's bytes once per
      ``H`` updates whatever ``K`` (None when a fit ended before its first whole round);
    * ``local_syncs``: each fit's ``[scheduled syncs, its end's]`` (`sync_counts`);
    * ``bytes_per_sync``: the largest fragment's bytes over the model's (`bytes_per_sync`).

    ``fragment_bytes``: each fragment's (`fragment_bytes`); None: ``model_bytes`` cut evenly.
    """
    side = local_side(name)
    k, every = side.fragments, side.sync_every
    pieces = list(fragment_bytes) if fragment_bytes else [model_bytes / k] * k
    sent = [sum(sync_bytes(0, u, every, pieces)) / u for u in updates]
    return {
        "allreduce_bytes_per_update": median(sent) if workers > 1 else 0.0,
        "steady_allreduce_bytes_per_update": (
            (sum(pieces) / every if all(u >= every for u in updates) else None)
            if workers > 1
            else 0.0
        ),
        "local_syncs": [list(sync_counts(0, u, every, k)) for u in updates],
        "bytes_per_sync": bytes_per_sync(pieces),
    }


def bytes_per_sync(fragment_bytes: Sequence[int]) -> float:
    """The largest fragment's bytes over the model's (1.0 without fragments; about ``1/K``)."""
    return max(fragment_bytes) / sum(fragment_bytes)


def syncs_between(before: int, after: int, sync_every: int, fragments: int = 1) -> int:
    """The syncs of a fit from update ``before`` to ``after``, its end's included
    (`sync_counts`)."""
    return sum(sync_counts(before, after, sync_every, fragments))
