"""Balanced batches: uneven workers share each global batch by their measured speed.

On MultiWorkerMirrored every worker takes the same share of the global batch, so a worker
at half speed halves the whole job's. With ``Trainer(balance=True)`` (``tfdist train
--balance=on``) the global batch stays the same examples, and each worker's share follows
its measured compute rate:

* every worker reads the whole global batch and trains on its slice of it
  (`tfdist.strategies.balanced_split`); the update weighs each worker by its real count,
  so any split gives the even split's update (tested to 1e-5 with SGD);
* after every window of updates (at the first call boundary after ``window`` updates; the
  calls are the even run's, ``steps_per_execution`` is never cut to fit a window) the workers
  gather their compute times, apart from their wait in the collective, in one all-reduce,
  and each takes the same decision (`tfdist.training.balance.control`): shares in proportion
  to the median rates of the last windows, only when the predicted gain beats the cost of
  moving (hysteresis plus the estimate's noise band), never below a floor, and back to even
  when the unloaded worker's time did not shrink with its share (it waits rather than
  computes);
* the chief logs each change (``Balance: worker:1 takes 88 of 256 examples per update
  ...``) and, beside a ``TensorBoard`` callback's logs, writes each worker's share and rate
  as scalars under ``balance/``.

A new ``fit`` starts from the even split and measures again (so does a resumed run: the
split is not part of a backup). Refused, each with one error: strategies other than
``multi_worker``, a model's own ``train_step`` (it averages replicas whatever their
counts), pipeline stages, and data of unknown length (pass ``steps_per_epoch``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from typing import Any

from tfdist import _compat
from tfdist.config import check_positive_int, invalid_argument
from tfdist.strategies.base import BalancingRunner, BatchShares, Runner
from tfdist.training.balance.control import Decision, SplitController, windows_from
from tfdist.training.health.monitor import tensorboard_dir
from tfdist.training.step.model_steps import Overrides

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BalanceOptions:
    """How a multi_worker run splits each global batch between its workers.

    Attributes:
        window: Least updates between decisions (each worker's clock summed over them). A
            decision falls between ``tf.function`` calls, at the first after ``window``
            updates: a call of more updates (``steps_per_execution``) makes a longer window.
        floor: No worker's share falls below this fraction of the even share.
        hysteresis: Least predicted cut of an update's compute time (a fraction of it) for a
            new split, on top of the estimate's noise band: the cost of moving.
        min_gain: Least measured cut of the compute time of the worker that a split away from
            even unloaded (a fraction of its time before, or a quarter of the predicted cut
            where that is less) for the split to stay (else back to even, and wait 2, 4, 8,
            ... windows).
        splits: Fixed splits instead of measured ones: ``((update, (examples per worker,
            ...)), ...)``, each taken at the first call from that update of the fit on (a
            resumed fit counts from its backup's position); for experiments and tests, each
            summing to the global batch.
    """

    window: int = 32
    floor: float = 0.25
    hysteresis: float = 0.05
    min_gain: float = 0.03
    splits: tuple[tuple[int, tuple[int, ...]], ...] | None = None

    def __post_init__(self) -> None:
        check_positive_int("BalanceOptions.window", self.window)
        for name in ("floor", "hysteresis", "min_gain"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise invalid_argument(f"BalanceOptions.{name}", value, "a number in [0, 1)")
        if self.splits is not None:
            try:
                splits = tuple((int(u), tuple(int(n) for n in s)) for u, s in self.splits)
            except (TypeError, ValueError):
                splits = None
            if not splits or any(u < 0 or min(s, default=0) < 1 for u, s in splits):
                raise invalid_argument(
                    "BalanceOptions.splits",
                    self.splits,
                    "pairs (update >= 0, (examples per worker, each >= 1, ...))",
                )
            object.__setattr__(self, "splits", tuple(sorted(splits)))


def balance_options(balance: Any) -> BalanceOptions | None:
    """The Trainer's ``balance`` argument as options (None: off)."""
    if balance is None or balance is False:
        return None
    if balance is True:
        return BalanceOptions()
    if isinstance(balance, BalanceOptions):
        return balance
    raise invalid_argument("balance", balance, "True, False or a tfdist.BalanceOptions")


def enable_balance(
    options: BalanceOptions | None, runner: Runner, model: Any, pipeline: Any
) -> BalanceOptions | None:
    """Refuses what balance cannot serve, then readies ``runner`` (a `BalancingRunner`);
    returns the options, or None when off (or with one worker: nothing to balance, said once)."""
    if options is None:
        return None
    refusal = runner.balance_refusal
    if refusal is None and not isinstance(runner, BalancingRunner):
        refusal = f"{type(runner).__name__} does not split global batches between workers."
    if refusal is None and Overrides.of(model).train_step:
        refusal = (
            f"{type(model).__name__} has its own train_step, whose gradients Keras averages "
            "over the replicas whatever their example counts: uneven shares would weigh "
            "examples unequally. Use the model's call and loss, or balance=False."
        )
    if refusal is None and pipeline is not None:
        refusal = "A pipeline cuts each replica's batch into equal micro-batches."
    if refusal is None and options.splits is None and _compat.op_determinism_enabled():
        refusal = (
            "Op determinism (tf.config.experimental.enable_op_determinism) forbids "
            "tf.timestamp, which a balanced run measures its workers with. Turn determinism "
            "off, or give fixed splits: BalanceOptions(splits=...)."
        )
    if refusal:
        raise invalid_argument("balance", options, "False on this Trainer", note=refusal)
    if len(runner.loop_tasks) < 2:
        if runner.is_chief:
            logger.warning("balance: one worker, nothing to balance; training on the even split.")
        return None
    # Fixed splits need no clock: nothing timed (and so no tf.timestamp) in the train loop.
    assert isinstance(runner, BalancingRunner)  # refused above otherwise
    runner.enable_balance().clock.enabled = options.splits is None
    return options


def _split_of(runner: Runner) -> BatchShares:
    """The split of a runner after `enable_balance` (a `BalancingRunner`)."""
    if not isinstance(runner, BalancingRunner) or runner.balanced is None:
        raise RuntimeError(f"{type(runner).__name__} is not balancing: enable_balance first.")
    return runner.balanced


class Balancer:
    """One fit's balancing: wraps ``start`` so that every worker re-decides between calls.

    Args:
        options: The balance options.
        runner: The fit's runner, a `BalancingRunner` after `enable_balance`.
        global_batch_size: This fit's global batch.
        summary_dir: Where the chief writes the ``balance/`` scalars, or None.
        updates: Updates made before this fit's first call (a resumed fit's position), the
            clock of fixed ``splits``.
    """

    def __init__(
        self,
        options: BalanceOptions,
        runner: Runner,
        global_batch_size: int,
        summary_dir: Any,
        *,
        updates: int = 0,
    ) -> None:
        self.options = options
        self.runner = runner
        self.split = _split_of(runner)
        self.labels = list(runner.loop_tasks)
        self.controller = SplitController(
            global_batch_size,
            self.split.workers,
            unit=self.split.local_replicas,
            floor=options.floor,
            hysteresis=options.hysteresis,
            min_gain=options.min_gain,
        )
        self.global_batch_size = global_batch_size
        self.updates = updates  # in this fit, from a resumed fit's position
        self._since = 0
        self._pending = list(options.splits or ())
        self._writer: Any = None
        self.summary_dir = summary_dir
        for _, shares in self._pending:
            self._check_split(shares)
        self.split.set(self.controller.even)
        self.split.clock.take()  # nothing from an earlier fit

    def _check_split(self, shares: Sequence[int]) -> None:
        unit = self.split.local_replicas
        if (
            len(shares) != self.split.workers
            or sum(shares) != self.global_batch_size
            or any(s % unit for s in shares)
        ):
            raise invalid_argument(
                "BalanceOptions.splits",
                tuple(shares),
                f"{self.split.workers} shares (multiples of {unit}) summing to the global batch "
                f"{self.global_batch_size}",
            )

    def wrap(self, start: Any) -> Any:
        """``start`` that first lets the split change (see
        `tfdist.training.fit.one_epoch.StartUpdates`)."""

        def balanced_start(micro_batches: int, iterator: Any, num_updates: int) -> Any:
            self.before_call()
            self.updates += num_updates
            self._since += num_updates
            return start(micro_batches, iterator, num_updates)

        return balanced_start

    def before_call(self) -> None:
        """Takes a scheduled split, or after a full window every worker's clock and the
        controller's decision (one all-reduce, at the same update on every worker)."""
        if self.options.splits is not None:
            due = [shares for update, shares in self._pending if update <= self.updates]
            if due:  # the last one due (a resumed fit may be past several)
                self._pending = self._pending[len(due) :]
                self._apply(Decision(list(due[-1]), "fixed", []))
            return
        if self._since < self.options.window:
            return
        self._since = 0
        mine = self.split.clock.take()
        rows = self.split.gather([mine["updates"], mine["compute"], mine["total"]])
        decision = self.controller.decide(windows_from(rows))
        if decision is not None:
            self._apply(decision)

    def _apply(self, decision: Decision) -> None:
        self.split.set(decision.shares)
        if not self.runner.is_chief:
            return
        logger.warning("%s", self.describe(decision))
        self._scalars(decision)

    def describe(self, decision: Decision) -> str:
        """The log line of a new split."""
        g, labels = self.global_batch_size, self.labels
        shares = ", ".join(f"{label} takes {n}" for label, n in zip(labels, decision.shares))
        if decision.reason == "fixed":
            return f"Balance: {shares} of every global batch of {g} (a fixed split)."
        judged = decision.judged
        if decision.reason == "even" and judged is not None:
            return (
                f"Balance: back to the even split ({shares} of {g}): a smaller share was to cut "
                f"{labels[judged.worker]}'s compute from {judged.before * 1e3:.1f} to "
                f"{judged.predicted * 1e3:.1f} ms per update, and it computed "
                f"{judged.after * 1e3:.1f} ms, so its time does not shrink with its share (it "
                f"waits rather than computes); trying again in {judged.backoff} windows."
            )
        fastest = max(decision.rates)
        rates = ", ".join(
            f"{label} computes at {r / fastest:.2f}x" for label, r in zip(labels, decision.rates)
        )
        step = decision.step
        return (
            f"Balance: {shares} of every global batch of {g} ({rates} the fastest's rate; "
            f"predicted gain {decision.gain * 1e3:.2f} ms of {step * 1e3:.2f} ms compute per "
            f"update, cost of moving {decision.cost * 1e3:.2f} ms: hysteresis "
            f"{(decision.cost - decision.band) * 1e3:.2f} + noise band "
            f"{decision.band * 1e3:.2f}, medians of {decision.windows} windows)."
        )

    def _scalars(self, decision: Decision) -> None:
        if self.summary_dir is None:
            return
        import tensorflow as tf

        if self._writer is None:
            self._writer = tf.summary.create_file_writer(os.path.join(self.summary_dir, "balance"))
        with self._writer.as_default(step=self.updates):
            for label, n in zip(self.labels, decision.shares):
                tf.summary.scalar(f"balance/share/{label.replace(':', '_')}", n)
            for label, r in zip(self.labels, decision.rates):
                tf.summary.scalar(f"balance/examples_per_second/{label.replace(':', '_')}", r)
        self._writer.flush()


def balanced_start(
    start: Any,
    options: BalanceOptions | None,
    runner: Runner,
    source: Any,
    steps: int | None,
    callbacks: Sequence[Any],
    position: Any,
) -> Any:
    """``start`` with balancing when ``options`` (see `Balancer`) for a fit of ``source``
    with ``steps`` per epoch (None: unknown), its ``callbacks`` (a ``TensorBoard`` gets the
    scalars) and the backup ``position`` it resumes from (or None)."""
    if options is None:
        return start
    if steps is None:
        raise invalid_argument(
            "steps_per_epoch",
            None,
            "a positive integer with balance=",
            note="The data's length is unknown, so the workers could not agree where a window "
            "of updates ends; pass steps_per_epoch, or give the dataset its length with "
            "tf.data.experimental.assert_cardinality.",
        )
    updates = 0 if position is None else position.updates
    balancer = Balancer(
        options, runner, source.global_batch_size, tensorboard_dir(callbacks), updates=updates
    )
    return balancer.wrap(start)
