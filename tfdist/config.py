"""Validated options and the one way tfdist words a bad-argument error.

Every user-facing check in tfdist raises through `invalid_argument`, so
messages read alike: the argument's name, what was received, what was expected.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from typing import Any, Literal, get_args

PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
#: Exit code of a process that saved a backup on SIGTERM and asks to be restarted (EX_TEMPFAIL).
PREEMPTED_EXIT_CODE = 75
#: Exit code of a process stopped by SIGTERM without a backup to resume from (128 + SIGTERM).
TERMINATED_EXIT_CODE = 143
#: Exit code of a task whose progress watchdog found a hang (its own, or another task's): every
#: task dumps its stacks and exits with it, and the launchers restart the group from its backup.
STUCK_EXIT_CODE = 76


def invalid_argument(
    name: str, received: Any, expected: str | Iterable[str], *, note: str = ""
) -> ValueError:
    """Builds the Keras-style error for a bad argument.

    Args:
        name: The argument's name, e.g. ``strategy`` or ``TF_CONFIG.task.index``.
        received: The value that was passed.
        expected: A sentence, or an iterable of the valid names.
        note: An optional sentence appended to the message (a hint or a fix).

    Returns:
        A ``ValueError`` to raise. Its text reads
        "Invalid value for argument `name`. Received: name=... Expected ...".
    """
    if not isinstance(expected, str):
        expected = "one of: " + ", ".join(str(e) for e in expected)
    msg = (
        f"Invalid value for argument `{name}`. Received: {name}={received!r}. Expected {expected}."
    )
    if note:
        msg += " " + note
    return ValueError(msg)


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """Returns ``value`` if it is one of ``choices``, else raises the standard error."""
    choices = tuple(choices)
    if value not in choices:
        raise invalid_argument(name, value, sorted(choices))
    return value


def check_positive_int(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    """Returns ``value`` if it is an int >= 1 (or None when allowed), else raises."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid_argument(
            name, value, "a positive integer" + (" or None" if allow_none else "")
        )
    return value


def check_steps_per_execution(value: Any) -> Any:
    """Returns ``steps_per_execution`` if it is a positive int or ``"auto"``, else raises."""
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise invalid_argument("steps_per_execution", value, "a positive integer or 'auto'")
    return value


def check_non_negative_int(
    name: str, value: Any, *, allow_none: bool = False, expected: str = "a non-negative integer"
) -> int | None:
    """Returns ``value`` if it is an int >= 0 (or None when allowed), else raises.

    ``expected`` words the error's "Expected ..." part, e.g. to name the unit.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid_argument(name, value, expected + (" or None" if allow_none else ""))
    return value


def check_positive_number(name: str, value: Any) -> float:
    """Returns ``value`` if it is a finite number > 0 (seconds, a factor), else raises."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 < value < float("inf")
    ):
        raise invalid_argument(name, value, "a finite number > 0")
    return float(value)


def check_fraction(name: str, value: Any) -> float:
    """Returns ``value`` if it is a number in [0, 1) (a rate such as dropout), else raises."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise invalid_argument(name, value, "a number in [0, 1)")
    return value


def check_directory(name: str, value: Any, *, allow_none: bool = True) -> Any:
    """Returns ``value`` if it can name a directory (str or os.PathLike), else raises.

    Checked when the argument is given, not when it is first written (after
    an epoch of training): a local path that is an existing file is refused.
    URLs (``gs://...``) are only type-checked.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, (str, os.PathLike)) and str(os.fspath(value)).strip():
        path = os.fspath(value)
        if "://" not in str(path) and os.path.exists(path) and not os.path.isdir(path):
            raise invalid_argument(
                name,
                str(path),
                "a directory, or a path where one can be created",
                note="It is an existing file.",
            )
        return value
    raise invalid_argument(
        name, value, "a directory path (str or os.PathLike)" + (" or None" if allow_none else "")
    )


#: The one list of strategy names: ``make_strategy``'s type, the CLI's choices and the
#: registry's keys (each kind but ``auto`` is built by ``tfdist/strategies/<name>.py``).
#: Spelled out as a ``Literal`` so type checkers see it. It lives here, not in the registry,
#: because the CLI validates it without TensorFlow, and importing anything under
#: ``tfdist.strategies`` loads TensorFlow (``tfdist/__init__.py`` applies the shims first).
StrategyName = Literal["auto", "one_device", "mirrored", "multi_worker", "parameter_server"]
STRATEGY_NAMES: tuple[str, ...] = get_args(StrategyName)
#: The one list of model names (``tfdist.models.get``'s keys), here for the same reason.
ModelName = Literal["mlp", "cnn", "convnet", "resnet", "transformer", "gpt"]
MODEL_NAMES: tuple[str, ...] = get_args(ModelName)


#: The built-in datasets (``tfdist.data.load``); "tfds:NAME" is any prepared TFDS dataset.
@dataclasses.dataclass(frozen=True)
class WatchdogOptions:
    """How long a section of ``fit`` may last before the task counts as stuck.

    A section's timeout is ``factor`` times the longest it took so far in this
    fit, kept between ``floor`` and ``ceiling`` seconds; until it has been seen
    once (the first call traces, the first save writes everything) it is
    ``first`` seconds. The defaults never fire on a slow first trace or a large
    save, and find a hang within ``floor`` seconds of an ordinary step
    (PyTorch's collective watchdog waits 10 minutes, Horovod's stall check 60 s).

    Attributes:
        factor: Safety factor over the longest observed duration.
        floor: Shortest timeout, in seconds.
        ceiling: Longest timeout once a section was seen, in seconds.
        first: Timeout of a section not seen yet in this fit (startup, first trace).
        exit: Exit with ``STUCK_EXIT_CODE`` on a hang (the default) or only log
            and dump stacks (in an interactive session, where exiting would
            end the kernel, that is the default).
        poll: Seconds between checks (at most ``floor / 4``).
    """

    factor: float = 10.0
    floor: float = 180.0
    ceiling: float = 1800.0
    first: float = 1800.0
    exit: bool | None = None
    poll: float = 1.0

    def __post_init__(self) -> None:
        for name in ("factor", "floor", "ceiling", "first", "poll"):
            check_positive_number(f"WatchdogOptions.{name}", getattr(self, name))
        if self.factor < 1:
            raise invalid_argument("WatchdogOptions.factor", self.factor, "a number >= 1")
        if self.ceiling < self.floor:
            raise invalid_argument(
                "WatchdogOptions.ceiling",
                self.ceiling,
                f"a number >= WatchdogOptions.floor ({self.floor})",
            )
        if self.exit is not None and not isinstance(self.exit, bool):
            raise invalid_argument("WatchdogOptions.exit", self.exit, "True, False or None")

    def timeout(self, longest: float | None) -> float:
        """The timeout after ``longest`` seconds at most so far (None: not seen yet: ``first``)."""
        if longest is None:
            return self.first
        return min(max(self.factor * longest, self.floor), self.ceiling)

    @property
    def interval(self) -> float:
        """Seconds between the watchdog's checks."""
        return min(self.poll, self.floor / 4)


DATASET_NAMES = ("digits", "patterns", "python_source", "synthetic", "tfds:NAME")
TFDS_PREFIX = "tfds:"


def is_tfds_name(name: Any) -> bool:
    """Whether ``name`` is "tfds:NAME" with a non-empty NAME (a prepared TFDS dataset)."""
    return isinstance(name, str) and name.startswith(TFDS_PREFIX) and len(name) > len(TFDS_PREFIX)


OPTIMIZER_NAMES = ("adam", "adamw", "sgd", "rmsprop")
COMMUNICATIONS = ("auto", "ring", "nccl")
LR_SCALINGS = ("none", "linear")
#: ``tfdist train --gradient_compression``: the gradients' all-reduce dtype ("none": float32). The
#: Trainer takes ``"bf16"``, ``"fp16"`` or None (``tfdist.training.step.exchange.COMPRESSIONS``).
GRADIENT_COMPRESSIONS = ("none", "bf16", "fp16")
#: ``tfdist train --sharding``: what each replica keeps only its block of ("off": everything
#: whole). The Trainer takes ``"optimizer"``, ``"gradients"``, ``"parameters"`` or None
#: (ZeRO-1/2/3).
SHARDINGS = ("off", "optimizer", "gradients", "parameters")


#: ``tfdist train --watchdog=...``: the ``WatchdogOptions`` fields a flag may set, and their types.
WATCHDOG_FIELDS = {"factor": float, "floor": float, "ceiling": float, "first": float}
WATCHDOG_FIELDS.update(exit=bool, poll=float)
#: ``tfdist train --stragglers=...``: the ``StragglerOptions`` fields a flag may set.
STRAGGLER_FIELDS = {
    "interval": float,
    "threshold": float,
    "min_wait": float,
    "log_scores": bool,
    "restart_after": int,
}
#: ``tfdist train --pipeline=...``: the ``PipelineOptions`` fields a flag may set (``split_at``
#: and ``devices`` join several values with ``+``: commas separate the pairs).
PIPELINE_FIELDS = {"split_at": str, "micro_batches": int, "devices": str, "allow_batch_norm": bool}
PIPELINE_FIELDS.update(stages=int, schedule=str)  # stages: with split_at=auto
#: ``tfdist train --balance=...`` and ``--model_options=...``: the fields a flag may set.
BALANCE_FIELDS = {"window": int, "floor": float, "hysteresis": float, "min_gain": float}
MODEL_OPTION_FIELDS = {"width": int, "depth": int, "heads": int, "dropout": float}
#: ``tfdist train --local_sgd=...``: ``sync_every`` (required), the outer optimizer (``outer``:
#: none, sgd or nesterov, DiLoCo's), its SGD's learning rate and momentum,
#: ``adapt_to_stragglers`` (true: a slower worker takes fewer inner steps a round) and
#: ``fragments`` (K: streaming DiLoCo's fragments synced in turn, a divisor of sync_every).
LOCAL_SGD_FIELDS = {"sync_every": int, "outer": str, "outer_learning_rate": float}
LOCAL_SGD_FIELDS.update(outer_momentum=float, adapt_to_stragglers=bool, fragments=int)
LOCAL_SGD_OUTERS = ("none", "sgd", "nesterov")
LOCAL_SGD_DEFAULTS = {"outer": "none", "sync_every": 0, "fragments": 1}  # 0: none given


def parse_options(
    name: str, text: str, fields: dict[str, type], *, on: bool = True
) -> dict[str, Any] | None:
    """An option flag's text as keyword arguments: ``"off"`` is None, ``"on"`` or ``""`` ``{}``.

    Args:
        name: The flag, for errors (``watchdog``).
        text: ``"off"``, ``""``, or ``key=value`` pairs separated by commas
            (``"floor=60,factor=5"``; booleans are ``true``/``false``).
        fields: The keys allowed, with their types.
        on: Whether ``"on"`` (every default) is a value; False where a key has no default.
    """
    if text == "off":
        return None
    switch = "'off', 'on', or" if on else "'off' or"
    expected = f"{switch} key=value pairs of: {', '.join(fields)}"
    if text == "on" and not on:
        raise invalid_argument(name, text, expected)
    kwargs: dict[str, Any] = {}
    if text == "on":
        return kwargs
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = pair.partition("=")
        if key not in fields or not value:
            raise invalid_argument(name, text, expected)
        kind = fields[key]
        try:
            if kind is bool:
                if value.lower() not in ("true", "false"):
                    raise ValueError(value)
                kwargs[key] = value.lower() == "true"
            else:
                kwargs[key] = kind(value)
        except ValueError:
            words = {bool: "true or false", int: "an integer", float: "a number"}[kind]
            raise invalid_argument(name, text, f"{key}= to be {words}") from None
    return kwargs


def _check_local_sgd(config: TrainConfig) -> None:
    """``--local_sgd``'s pairs, and the flags it cannot go with (the Trainer's refusals, known
    before TF loads)."""
    kwargs = parse_options("local_sgd", config.local_sgd or "off", LOCAL_SGD_FIELDS, on=False)
    if kwargs is None:
        return
    outer, every, fragments = (kwargs.get(k, d) for k, d in LOCAL_SGD_DEFAULTS.items())
    problems = [
        (every < 1, "sync_every=H with H a positive integer"),
        (fragments < 1 or every % fragments > 0, "fragments= a positive divisor of sync_every"),
        (
            fragments > 1 and kwargs.get("adapt_to_stragglers", False),
            "fragments=1 with adapt_to_stragglers=true",
        ),
        (outer not in LOCAL_SGD_OUTERS, "outer= one of " + ", ".join(LOCAL_SGD_OUTERS)),
        (
            outer == "none" and len({"outer_learning_rate", "outer_momentum"} & set(kwargs)) > 0,
            "outer=sgd or outer=nesterov with outer_learning_rate or outer_momentum",
        ),
        (kwargs.get("outer_learning_rate", 1.0) <= 0, "outer_learning_rate= a positive number"),
        (not 0 <= kwargs.get("outer_momentum", 0.0) < 1, "outer_momentum= a number in [0, 1)"),
        (config.strategy == "parameter_server", "off with --strategy=parameter_server"),
        (config.pipeline not in ("", "off"), "off with --pipeline"),
        (config.balance not in ("", "off"), "off with --balance"),
        (config.sharding is not None, "off with --sharding"),
        (
            kwargs.get("adapt_to_stragglers", False)
            and config.strategy in ("multi_worker", "auto")
            and config.stragglers != "off",
            "adapt_to_stragglers=false unless --stragglers=off (the straggler report times "
            "each update from inside it, where an update cannot be skipped)",
        ),
    ]
    for wrong, expected in problems:
        if wrong:
            raise invalid_argument("local_sgd", config.local_sgd, expected)


def _check_strategy(config: TrainConfig) -> None:
    """A strategy by name; with a pipeline, None (TF's default strategy) without sharding, or
    ``multi_worker`` (the hybrid)."""
    if config.pipeline in ("", "off") or config.strategy == "multi_worker":
        check_choice("strategy", config.strategy, STRATEGY_NAMES)
    elif config.strategy is not None:
        expected = "None (one process) or 'multi_worker' (the hybrid) with pipeline"
        raise invalid_argument("strategy", config.strategy, expected)
    elif config.sharding is not None:
        expected = "None with pipeline in one process (one replica: nothing to shard over)"
        raise invalid_argument("sharding", config.sharding, expected)


_OPTIONAL_COUNTS = ("num_workers", "num_ps", "min_shard_bytes", "steps_per_epoch", "bucket_bytes")
_OPTIONAL_COUNTS += ("seq_len", "max_bytes")  # TrainConfig's fields: a positive int or None


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Options of one ``tfdist train`` job, validated once on construction: the CLI's flags, one
    to one. ``backup_freq``: updates between ``backup_dir``'s backups (None: each epoch).
    ``gradient_compression``, ``bucket_bytes``, ``sharding`` ("none", "off": stored as None),
    ``pipeline``, ``balance`` and ``local_sgd`` (``PIPELINE_FIELDS``, ``BALANCE_FIELDS``,
    ``LOCAL_SGD_FIELDS`` pairs) are the Trainer's (a pipeline in one process: ``strategy``
    None); ``model_options`` (pairs of ``MODEL_OPTION_FIELDS``) go to ``models.get``,
    ``seq_len``, ``max_bytes`` to python_source.
    """

    strategy: str | None = "mirrored"
    num_devices: int | None = 2
    communication: str = "auto"
    num_workers: int | None = None
    num_ps: int | None = None
    min_shard_bytes: int | None = None
    model: str = "cnn"
    model_options: str = ""
    dataset: str = "digits"
    seq_len: int | None = None
    max_bytes: int | None = None
    data_dir: str | None = None
    epochs: int = 8
    global_batch_size: int = 64
    steps_per_epoch: int | None = None
    precision: str = "float32"
    steps_per_execution: int | str = "auto"
    accumulation_steps: int = 1
    optimizer: str = "adam"
    learning_rate: float = 2e-3
    lr_scaling: str = "none"
    base_global_batch_size: int = 256
    warmup_steps: int | None = None
    warmup_epochs: float | None = None
    model_dir: str | None = None
    backup_dir: str | None = None
    backup_freq: int | None = None
    seed: int = 0
    verbose: int = 2
    watchdog: str = ""
    stragglers: str = ""
    gradient_compression: str | None = None
    bucket_bytes: int | None = None
    sharding: str | None = None
    pipeline: str = ""
    balance: str = ""
    local_sgd: str = ""

    def __post_init__(self) -> None:
        check_positive_int("num_devices", self.num_devices, allow_none=True)
        check_choice("communication", self.communication, COMMUNICATIONS)
        for name in _OPTIONAL_COUNTS:
            check_positive_int(name, getattr(self, name), allow_none=True)
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("model", self.model, MODEL_NAMES)
        parse_options("model_options", self.model_options, MODEL_OPTION_FIELDS, on=False)
        if not (self.dataset in DATASET_NAMES[:-1] or is_tfds_name(self.dataset)):
            raise invalid_argument("dataset", self.dataset, DATASET_NAMES)
        check_choice("optimizer", self.optimizer, OPTIMIZER_NAMES)
        for name in ("epochs", "global_batch_size", "accumulation_steps"):
            check_positive_int(name, getattr(self, name))
        check_steps_per_execution(self.steps_per_execution)
        check_choice("lr_scaling", self.lr_scaling, LR_SCALINGS)
        check_positive_int("base_global_batch_size", self.base_global_batch_size)
        check_positive_int("backup_freq", self.backup_freq, allow_none=True)
        if self.backup_freq is not None and not self.backup_dir:
            raise invalid_argument(
                "backup_freq",
                self.backup_freq,
                "None without backup_dir",
                note="Set backup_dir too: the frequency is of backups to that directory.",
            )
        if not (isinstance(self.learning_rate, (int, float)) and self.learning_rate > 0):
            raise invalid_argument("learning_rate", self.learning_rate, "a positive number")
        check_directory("model_dir", self.model_dir)
        if self.gradient_compression is not None:
            check_choice("gradient_compression", self.gradient_compression, GRADIENT_COMPRESSIONS)
            if self.gradient_compression == "none":
                object.__setattr__(self, "gradient_compression", None)  # the Trainer's float32
        if self.sharding is not None:
            check_choice("sharding", self.sharding, SHARDINGS)
            if self.sharding == "off":
                object.__setattr__(self, "sharding", None)
        parse_options("pipeline", self.pipeline or "off", PIPELINE_FIELDS, on=False)
        _check_strategy(self)
        _check_local_sgd(self)
        parse_options("watchdog", self.watchdog, WATCHDOG_FIELDS)
        if parse_options("balance", self.balance or "off", BALANCE_FIELDS) is not None:
            if self.strategy not in ("multi_worker", "auto") or self.pipeline not in ("", "off"):
                raise invalid_argument(
                    "balance",
                    self.balance,
                    f"off with --strategy={self.strategy} --pipeline={self.pipeline or 'off'}",
                    note="It splits each global batch between the workers of "
                    "--strategy=multi_worker by their speed (not with a pipeline).",
                )
        stragglers = parse_options("stragglers", self.stragglers, STRAGGLER_FIELDS)
        if stragglers and stragglers.get("restart_after") and not self.backup_dir:
            raise invalid_argument(
                "stragglers",
                self.stragglers,
                "no restart_after without backup_dir",
                note="Stopping for a straggler saves a backup to resume from: set backup_dir.",
            )
        if isinstance(self.verbose, bool) or self.verbose not in (0, 1, 2):
            raise invalid_argument(
                "verbose", self.verbose, "0 (silent), 1 (progress bar) or 2 (one line per epoch)"
            )
