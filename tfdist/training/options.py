"""The Trainer's option groups, and `TrainerOptions`: all of a Trainer's options in one bundle.

``BackupOptions``, ``LRScaling`` and ``ExchangeOptions`` live here; the other four groups live
next to what they configure (``WatchdogOptions`` in `tfdist.config`, ``StragglerOptions`` in
`tfdist.training.health.stragglers`, ``PipelineOptions`` in `tfdist.training.pipeline.options`,
``BalanceOptions`` in `tfdist.training.balance.balancer`). Each is a small frozen dataclass,
checked once when it is made; the Trainer checks its keywords, builds one `TrainerOptions`
(``trainer.options``) and hands it whole to the fit path.

::

    trainer = tfdist.Trainer(
        build, strategy=strategy, loss=..., accumulation_steps=4,
        backup=tfdist.BackupOptions("gs://bucket/run1", freq=100, keep_last=3),
        lr_scaling=tfdist.LRScaling("linear", base_global_batch_size=256, warmup_epochs=1),
        exchange=tfdist.ExchangeOptions(compression="bf16", bucket_bytes=4 << 20))

The flat keywords ``backup_dir``, ``backup_freq``, ``keep_backup``,
``keep_backups``, ``lr_scaling="linear"``, ``base_global_batch_size``,
``warmup_steps``, ``warmup_epochs``, ``gradient_compression`` and
``bucket_bytes`` stay as shortcuts that fill one field each
(`SHORTCUTS`); `from_shortcuts` checks them under their own names,
so an error names the keyword the user wrote.
"""

from __future__ import annotations

import dataclasses
import os
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from tfdist.config import (
    LR_SCALINGS,
    WatchdogOptions,
    check_choice,
    check_directory,
    check_non_negative_int,
    check_positive_int,
    invalid_argument,
)
from tfdist.training.backup.writer import check_frequency
from tfdist.training.step.exchange import COMPRESSIONS, Compression

if TYPE_CHECKING:  # annotations only: the bundle does not import what the groups configure
    from tfdist.training.balance.balancer import BalanceOptions
    from tfdist.training.health.stragglers import StragglerOptions
    from tfdist.training.local_sgd.options import LocalSGDOptions
    from tfdist.training.pipeline.options import PipelineOptions

ScalingRule = Literal["none", "linear"]  # the names are tfdist.config.LR_SCALINGS
_FIELD_NAMES: Mapping[str, str] = types.MappingProxyType({})  # errors name the fields themselves


def _named(names: Mapping[str, str], field: str) -> str:
    return names.get(field, field)


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise invalid_argument(name, value, "True or False")


@dataclasses.dataclass(frozen=True)
class BackupOptions:
    """Fault tolerance: a step-exact backup that a restarted ``fit`` resumes from.

    A restarted ``fit`` resumes at the exact update of the last backup,
    skipping the micro-batches already trained on (each epoch's data order
    depends only on the seed and the epoch). On SIGTERM the run saves at the
    next step boundary and exits with code 75, which ``tfdist launch``
    restarts.

    Args:
        dir: Where to keep the backup (model, optimizer, loss scale, counters,
            epoch and position in it); any ``tf.io.gfile`` path. Only the chief
            writes, with an atomic commit (see `tfdist.training.backup.writer`
            for which filesystems make it so). Every worker restores the
            chief's backup, so with several workers it must be shared storage
            (else a clear error). Restoring loads weight files: use a trusted
            directory.
        freq: ``"epoch"`` or a number of optimizer updates between backups (a
            backup is also taken at every epoch end).
        keep_last: How many of the newest backups ``dir`` holds; older ones
            are deleted once a newer one is committed. Only the newest is
            resumed from; ``state.json`` lists the kept ones.
        keep_after_success: Keep the backups after a successful run (default:
            remove them).
        asynchronous: Write and commit each backup in the background while
            training goes on (default): a save stalls training only to copy
            the values to host memory (which holds a second copy of the
            variables). One backup is in flight at a time; the next save, the
            end of ``fit`` and a SIGTERM save wait for its commit and raise its
            failure. A crash at any moment leaves the last committed backup.
            ``False``: each save returns once committed.

    Raises:
        ValueError: For a ``dir`` that is a file or not a path, a ``freq``
            that is neither ``"epoch"`` nor a positive int, a non-positive
            ``keep_last``, or a non-bool ``keep_after_success`` or ``asynchronous``.
    """

    dir: str | os.PathLike
    freq: int | Literal["epoch"] = "epoch"
    keep_last: int = 1
    keep_after_success: bool = False
    asynchronous: bool = True

    def __post_init__(self) -> None:
        self.check(vars(self))

    @staticmethod
    def check(values: Mapping[str, Any], names: Mapping[str, str] = _FIELD_NAMES) -> None:
        """Checks field ``values``; an error names ``names[field]`` (default the field)."""
        if "dir" in values:
            name = _named(names, "dir")
            # As the shortcut backup_dir, None is valid (no backups); a BackupOptions needs a dir.
            check_directory(name, values["dir"], allow_none=name != "dir")
        if "freq" in values:
            check_frequency(_named(names, "freq"), values["freq"], "optimizer updates")
        if "keep_last" in values:
            check_positive_int(_named(names, "keep_last"), values["keep_last"])
        if "keep_after_success" in values:
            _check_bool(_named(names, "keep_after_success"), values["keep_after_success"])
        if "asynchronous" in values:
            _check_bool(_named(names, "asynchronous"), values["asynchronous"])


@dataclasses.dataclass(frozen=True)
class LRScaling:
    """Learning-rate scaling and warmup for large batches (Goyal et al., 2017).

    Args:
        rule: ``"linear"`` multiplies the learning rate by
            ``accumulation_steps * global_batch_size / base_global_batch_size``;
            ``"none"`` leaves it (warmup only).
        base_global_batch_size: The batch size the base learning rate is for.
        warmup_steps: Ramp the learning rate linearly over this many optimizer
            updates (from the base rate when scaling, else from 0).
        warmup_epochs: The same in epochs; give at most one of the two.

    Raises:
        ValueError: For an unknown rule, a non-positive base batch, a negative
            warmup, or both warmups.
    """

    rule: ScalingRule
    base_global_batch_size: int = 256
    warmup_steps: int | None = None
    warmup_epochs: float | None = None

    def __post_init__(self) -> None:
        self.check(vars(self))

    @staticmethod
    def check(values: Mapping[str, Any], names: Mapping[str, str] = _FIELD_NAMES) -> None:
        """Checks field ``values``; an error names ``names[field]`` (default the field)."""
        if "rule" in values:
            check_choice(_named(names, "rule"), values["rule"], LR_SCALINGS)
        if "base_global_batch_size" in values:
            check_positive_int(
                _named(names, "base_global_batch_size"), values["base_global_batch_size"]
            )
        steps, epochs = values.get("warmup_steps"), values.get("warmup_epochs")
        steps_name, epochs_name = _named(names, "warmup_steps"), _named(names, "warmup_epochs")
        if steps is not None and epochs is not None:
            raise invalid_argument(
                epochs_name,
                epochs,
                f"None when {steps_name} is given",
                note=f"Received {steps_name}={steps} as well; pass one of them.",
            )
        check_non_negative_int(
            steps_name,
            steps,
            allow_none=True,
            expected="a non-negative integer (optimizer updates)",
        )
        if epochs is not None and (
            isinstance(epochs, bool) or not isinstance(epochs, (int, float)) or epochs < 0
        ):
            raise invalid_argument(epochs_name, epochs, "a non-negative number of epochs")

    @property
    def active(self) -> bool:
        """Whether the learning rate differs from the optimizer's own at any step."""
        return self.rule != "none" or bool(self.warmup_steps) or bool(self.warmup_epochs)


@dataclasses.dataclass(frozen=True)
class ExchangeOptions:
    """How the summed gradients travel in the one all-reduce per update.

    Args:
        compression: ``"bf16"`` or ``"fp16"`` all-reduces the gradients in 16
            bits (half the bytes) and casts them back to float32 at once; fp16
            is scaled per bucket so the sum cannot overflow. Changes numerics
            slightly (a bf16 value has 8 significant bits). ``None``: float32.
        bucket_bytes: Bucketed all-reduce: gradients in reverse layer order,
            about this many bytes per all-reduce, each started as soon as its
            gradients exist (overlapping the backward pass). The sums are those
            of the single all-reduce. ``None``: one packed all-reduce. See
            `tfdist.training.step.exchange`.
        sharding: ``"optimizer"`` (ZeRO-1) keeps on each replica the optimizer state
            of only its ``1/N`` block of every variable; ``"gradients"`` (ZeRO-2) also
            keeps only its block of the summed gradients (with accumulation, the sum
            buffer too, reduced every micro-batch); ``"parameters"`` (ZeRO-3) also keeps
            only its block of every trainable variable, each top-level layer's weights
            gathered just before it runs and again for its backward, whose gradients are
            reduce-scattered there and then (between fits the model is whole; during a fit
            only blocks exist: `tfdist.training.zero.parameters`). Mirrored and
            MultiWorkerMirrored only; the weights equal unsharded training's. See
            `tfdist.training.zero.state`. ``None``: every replica holds everything.
        sparse: How sparse gradients (an ``Embedding`` lookup's ``tf.IndexedSlices``) travel.
            ``"auto"``: as rows, gathered from every replica (indices and values, duplicates
            kept), so the optimizer gets the slices Keras's ``fit`` on one device hands it:
            Adam and the other optimizers that square a gradient treat duplicate rows as Keras
            does. It sends fewer bytes than the dense gradient while a batch touches few rows
            of a large vocabulary. ``"dense"``: summed into a dense gradient first and
            all-reduced with the others (Horovod's ``sparse_as_dense``): cheaper when batches
            touch most rows, the same weights with SGD, other weights with Adam (duplicate rows
            summed before they are squared).
        keep_whole_below: With ``sharding="parameters"``: trainable variables of fewer
            elements than this stay whole and mirrored on every replica, never cut nor
            gathered (DeepSpeed's ``stage3_param_persistence_threshold``): biases, norms'
            scales and offsets. Their gradients are all-reduced whole with the update's
            example count, and a layer whose variables are all kept (a ``LayerNormalization``)
            runs as a plain layer, without a gather or a recompute. Fewer collectives per step
            for a little memory; the weights are those without it. ``None`` (the default):
            every trainable variable is sharded.
        units: With ``sharding="parameters"``: a tuple of layer classes and/or layer names
            (FSDP2's ``fully_shard`` on chosen modules, its auto wrap policy's
            ``TransformerBlock``). Every layer anywhere in the model that matches (inside
            nested models and inside subclassed models and layers) is a unit: its weights
            gathered just before its call and released after, gathered again for its backward,
            where its gradients are reduce-scattered. Every other trainable weight is gathered
            once per step on the step's tape. The way to shard a subclassed transformer block
            by block (`tfdist.training.zero.named_units`). ``None`` (the default): each
            top-level layer is a unit (a subclassed model: one).

    Raises:
        ValueError: For an unknown compression, sharding or sparse mode, a non-positive
            ``bucket_bytes``, or a ``keep_whole_below`` that is not a non-negative integer
            or is given without ``sharding="parameters"``, or ``units`` that is not a non-empty
            tuple of Keras layer classes and layer names, or is given without
            ``sharding="parameters"``.
    """

    compression: Compression | None = None
    bucket_bytes: int | None = None
    sharding: Literal["optimizer", "gradients", "parameters"] | None = None
    sparse: Literal["auto", "dense"] = "auto"
    keep_whole_below: int | None = None
    units: tuple | None = None

    def __post_init__(self) -> None:
        self.check(vars(self))
        if isinstance(self.units, list):  # frozen and hashable: held as a tuple
            object.__setattr__(self, "units", tuple(self.units))

    @staticmethod
    def check(values: Mapping[str, Any], names: Mapping[str, str] = _FIELD_NAMES) -> None:
        """Checks field ``values``; an error names ``names[field]`` (default the field)."""
        compression = values.get("compression")
        if compression is not None and compression not in COMPRESSIONS:
            raise invalid_argument(
                _named(names, "compression"),
                compression,
                "one of: bf16, fp16, None",
                note="The gradients are all-reduced in 16 bits and summed back in float32.",
            )
        check_positive_int(
            _named(names, "bucket_bytes"), values.get("bucket_bytes"), allow_none=True
        )
        sharding = values.get("sharding")
        if sharding is not None and sharding not in ("optimizer", "gradients", "parameters"):
            raise invalid_argument(
                _named(names, "sharding"),
                sharding,
                "one of: optimizer, gradients, parameters, None",
                note="'optimizer' shards the optimizer state over the replicas (ZeRO-1), "
                "'gradients' the gradients too (ZeRO-2), 'parameters' the weights too (ZeRO-3).",
            )
        for field in ("compression", "bucket_bytes"):
            if sharding == "parameters" and values.get(field) is not None:
                raise invalid_argument(
                    _named(names, field),
                    values[field],
                    "None with sharding='parameters'",
                    note="Sharded parameters reduce-scatter each layer's gradients in float32 "
                    "inside its backward: there is no bucketed or 16-bit exchange to configure.",
                )
        if values.get("sparse", "auto") not in ("auto", "dense"):
            raise invalid_argument(
                _named(names, "sparse"),
                values["sparse"],
                "one of: auto, dense",
                note="'auto' gathers an embedding's gradient rows as Keras hands them; "
                "'dense' sums them into a dense gradient first.",
            )
        _check_keep_whole(values, names)
        _check_units(values, names)


def _check_keep_whole(values: Mapping[str, Any], names: Mapping[str, str]) -> None:
    """``keep_whole_below``: a non-negative int (elements), only with sharding='parameters'."""
    name, threshold = _named(names, "keep_whole_below"), values.get("keep_whole_below")
    check_non_negative_int(
        name, threshold, allow_none=True, expected="a non-negative integer (elements)"
    )
    if threshold is not None and values.get("sharding") != "parameters":
        raise invalid_argument(
            name,
            threshold,
            f"None with sharding={values.get('sharding')!r} (or sharding='parameters')",
            note="Only sharded parameters (ZeRO-3) cut variables into blocks; the other modes "
            "keep every variable whole already.",
        )


def _check_units(values: Mapping[str, Any], names: Mapping[str, str]) -> None:
    """``units``: a non-empty tuple (or list) of Keras layer classes and non-empty names, only
    with sharding='parameters'."""
    name, units = _named(names, "units"), values.get("units")
    if units is None:
        return
    expected = "a non-empty tuple of Keras layer classes and layer names (str)"
    if not isinstance(units, (tuple, list)) or not units:
        raise invalid_argument(name, units, expected)
    import keras  # lazily: the options load without Keras until units are given

    for entry in units:
        is_class = isinstance(entry, type) and issubclass(entry, keras.layers.Layer)
        if not is_class and not (isinstance(entry, str) and entry):
            raise invalid_argument(
                name,
                units,
                expected,
                note=f"{entry!r} ({type(entry).__name__}) is neither a subclass of "
                "keras.layers.Layer nor a layer's name.",
            )
    if values.get("sharding") != "parameters":
        raise invalid_argument(
            name,
            units,
            f"None with sharding={values.get('sharding')!r} (or sharding='parameters')",
            note="Only sharded parameters (ZeRO-3) gather a layer's weights around its call.",
        )


#: The Trainer's flat shortcut keywords: option class, its Trainer keyword, and field -> shortcut.
SHORTCUTS: dict[type, tuple[str, dict[str, str]]] = {
    BackupOptions: (
        "backup",
        {
            "dir": "backup_dir",
            "freq": "backup_freq",
            "keep_last": "keep_backups",
            "keep_after_success": "keep_backup",
        },
    ),
    LRScaling: (
        "lr_scaling",
        {
            "rule": "lr_scaling",
            "base_global_batch_size": "base_global_batch_size",
            "warmup_steps": "warmup_steps",
            "warmup_epochs": "warmup_epochs",
        },
    ),
    ExchangeOptions: (
        "exchange",
        {
            "compression": "gradient_compression",
            "bucket_bytes": "bucket_bytes",
            "sharding": "sharding",
            "keep_whole_below": "keep_whole_below",
            "units": "units",
        },
    ),
}


#: The Trainer's shortcut keywords that are not also an option group's keyword (``lr_scaling`` is).
SHORTCUT_KEYWORDS = frozenset(
    name for _, names in SHORTCUTS.values() for name in names.values()
) - {keyword for keyword, _ in SHORTCUTS.values()}


def from_shortcuts(cls: type, options: Any, shortcuts: Mapping[str, Any]) -> Any:
    """A Trainer option group: ``options`` as given, else an object built from its shortcuts.

    Args:
        cls: `BackupOptions`, `LRScaling` or `ExchangeOptions`.
        options: The object passed as the group's keyword, or None.
        shortcuts: The group's flat keywords as passed (None: not given).

    Returns:
        ``options``, else an object built from the shortcuts given (the
        defaults for the others), or None when none is given and a field is
        required (a `BackupOptions`'s ``dir``).

    Raises:
        ValueError: For a bad shortcut value (named as the shortcut), for a
            shortcut given next to an option object (one place per setting), or
            for shortcuts given without the required one (``backup_freq``
            without ``backup_dir`` would make no backups).
    """
    keyword, names = SHORTCUTS[cls]
    given = {
        field: shortcuts[name] for field, name in names.items() if shortcuts.get(name) is not None
    }
    if options is not None:
        if not isinstance(options, cls):
            raise invalid_argument(keyword, options, f"a tfdist.{cls.__name__} or None")
        if given:
            field = next(iter(given))
            raise invalid_argument(
                names[field],
                given[field],
                f"None when `{keyword}` is given",
                note=f"Set it once, as {cls.__name__}({field}=...), or use "
                "only the shortcut keywords.",
            )
        return options
    cls.check(given, names)  # the user wrote the shortcuts: name them in any error
    required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
    missing = [field for field in required if field not in given]
    if missing and given:
        field = next(iter(given))
        raise invalid_argument(
            names[field],
            given[field],
            f"None unless `{names[missing[0]]}` is given",
            note=f"Without `{names[missing[0]]}` it would do nothing. Pass "
            f"`{names[missing[0]]}` too, or drop `{names[field]}`.",
        )
    if missing:
        return None
    return cls(**given)


def trainer_options(
    *,
    backup: BackupOptions | None,
    lr_scaling: LRScaling | str,
    exchange: ExchangeOptions | None,
    **shortcuts: Any,
) -> tuple[BackupOptions | None, LRScaling | None, ExchangeOptions | None]:
    """The Trainer's three option groups from its keywords (objects or shortcuts), checked once.

    Returns:
        ``(backup, lr_scaling, exchange)``: ``backup`` is None without a
        directory; the other two hold their defaults when nothing is given.
    """
    # `lr_scaling` is both the LRScaling object's keyword and the shortcut for its rule.
    as_object = isinstance(lr_scaling, LRScaling)
    return (
        from_shortcuts(BackupOptions, backup, shortcuts),
        from_shortcuts(
            LRScaling,
            lr_scaling if as_object else None,
            {**shortcuts, "lr_scaling": None if as_object else lr_scaling},
        ),
        from_shortcuts(ExchangeOptions, exchange, shortcuts),
    )


@dataclasses.dataclass(frozen=True)
class TrainerOptions:
    """Every option of one Trainer, checked, in one frozen bundle: ``trainer.options``.

    The Trainer builds it once from its keywords (option objects or shortcuts) and passes it
    whole to the fit path (`tfdist.training.fit.run.run_fit`); the Trainer's attributes of the
    same names read it (`OptionAttribute`).

    Attributes:
        precision: The dtype policy in use (``"auto"`` resolved).
        accumulation_steps: Micro-batches per optimizer update (a compiled optimizer's
            ``gradient_accumulation_steps`` taken over).
        steps_per_execution: As given (``"auto"`` is resolved by each fit), or what the model
            was compiled with.
        backup: Step-exact backups, or None without a directory.
        lr_scaling: Learning-rate scaling and warmup.
        exchange: How gradients are all-reduced (and whether the optimizer state is sharded).
        watchdog: The progress watchdog's options, or None (off).
        stragglers: The straggler report's options, or None (off).
        pipeline: The pipeline stages' options, or None (no pipeline).
        balance: Balanced batches' options, or None (off, or one worker: nothing to balance).
        local_sgd: Local SGD or DiLoCo (`tfdist.training.local_sgd`), or None (off).
    """

    precision: str
    accumulation_steps: int
    steps_per_execution: int | Literal["auto"]
    backup: BackupOptions | None
    lr_scaling: LRScaling
    exchange: ExchangeOptions
    watchdog: WatchdogOptions | None
    stragglers: StragglerOptions | None
    pipeline: PipelineOptions | None
    balance: BalanceOptions | None
    local_sgd: LocalSGDOptions | None = None


class OptionAttribute:
    """A read-only attribute of the Trainer that reads the field of its name in
    ``trainer.options``, so that each option is held in one place."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, trainer: Any, owner: type | None = None) -> Any:
        if trainer is None:
            return self
        return getattr(trainer.options, self.name)

    def __set__(self, trainer: Any, value: Any) -> None:
        raise AttributeError(f"Trainer.{self.name} is read-only: it is held in trainer.options")
