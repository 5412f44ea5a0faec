"""What each worker of ``tfdist bench --benchmarks=health`` runs (its parent: ``parent.py``).

Every worker builds three ``tfdist.Trainer``\\ s on the same MultiWorkerMirrored
strategy, model (the CNN on scikit-learn's 8x8 digits, from the same initial
weights), optimizer (SGD) and data; only the health options differ:

* ``off``: ``watchdog=None, stragglers=None``: no health thread, no timestamps;
* ``on``: the Trainer's defaults (``WatchdogOptions()``, ``StragglerOptions()``);
* ``on_fast``: the default watchdog and ``StragglerOptions(interval=fast_interval,
  log_scores=True)``, so that the workers publish their step sections and the
  chief scores a round every ``fast_interval`` seconds during each measurement.

After one untimed fit per side (traces, starts the pipelines) the sides
alternate, ``repeats`` rounds of ``steps`` steps each, counting the optimizer
updates: ``off on on_fast``, then ``on on_fast off``, and so on, so that ``off``
runs first and last in turn and ``on_fast`` always right after ``on``. The chief
of a fit may take the last clock window a previous fit left on the board for a
current one, and then skip every window up to that number (seen: an ``on_fast``
fit right after another scored no round); an ``on`` fit's states carry no
window most of the time, so it clears the board for the next ``on_fast``.

During each measured fit a callback (epoch hooks only, so the steps per call
do not change) notes whether this task's health
thread was running and whether its runner's step clock was on; on the chief a
log handler counts the straggler rounds scored (``log_scores`` logs one line per
round) and the straggler warnings.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import keras

import tfdist
from tfdist.bench.harness import fits
from tfdist.bench.harness.worker_common import Recorder
from tfdist.bench.scaling.sides import Side, fit_side

SIDES = ("off", "on", "on_fast")
#: The order of even and odd rounds (see the module docstring).
ORDERS = (SIDES, ("on", "on_fast", "off"))
#: The name of the fit's health thread (``tfdist.training.health.monitor.Health``).
HEALTH_THREAD = "tfdist-health"
STRAGGLER_LOGGER = "tfdist.training.health.stragglers"


def health_options(side: str, fast_interval: float) -> dict[str, Any]:
    """The Trainer keywords of ``side``: none for the defaults (watchdog and straggler report)."""
    if side == "off":
        return {"watchdog": None, "stragglers": None}
    if side == "on_fast":
        return {"stragglers": tfdist.StragglerOptions(interval=fast_interval, log_scores=True)}
    return {}


class Rounds(logging.Handler):
    """Counts the straggler report's log lines: rounds scored (``log_scores``) and warnings."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.scored = 0
        self.warnings = 0
        self.last = None

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Straggler scores:"):
            self.scored += 1
            self.last = message
        elif record.levelno >= logging.WARNING and message.startswith("Straggler:"):
            self.warnings += 1


class Probe(keras.callbacks.Callback):
    """At the end of the measured epoch: was the health thread running, the step clock on?"""

    def __init__(self, runner: Any) -> None:
        super().__init__()
        self.runner = runner
        self.seen: dict[str, bool] = {}

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.seen = {
            "health_thread": any(
                t.name == HEALTH_THREAD and t.is_alive() for t in threading.enumerate()
            ),
            "step_clock_enabled": bool(self.runner.step_clock.enabled),
        }


def _side(
    strategy: Any, builder: Any, data: Any, spec: dict[str, Any], name: str, gbs: int
) -> tuple[Side, Probe, Any]:
    trainer = tfdist.Trainer(
        builder,
        strategy=strategy,
        optimizer=keras.optimizers.SGD(spec["learning_rate"]),
        loss=fits.logits_loss(),
        steps_per_execution=int(spec["steps_per_execution"]),
        **health_options(name, float(spec["fast_interval"])),
    )
    probe = Probe(trainer.runner)

    def fit(**kw: Any) -> Any:
        kw["callbacks"] = [*kw.get("callbacks", []), probe]
        return trainer.fit(data, global_batch_size=gbs, **kw)

    side = fit_side(fit, lambda: trainer.model.optimizer, int(spec["steps"]), gbs)
    return side, probe, trainer


def run_mwms(spec: dict[str, Any]) -> dict[str, Any]:
    """Times the three sides alternately on this worker; returns seconds, updates and probes."""
    strategy = tfdist.make_strategy("multi_worker")
    workers = strategy.num_replicas_in_sync
    gbs = int(spec["per_worker_batch_size"]) * workers
    steps, repeats = int(spec["steps"]), int(spec["repeats"])
    base = tfdist.data.load("digits", split="train").bind(global_batch_size=gbs)
    builder = fits.seeded(
        lambda: tfdist.models.get("cnn", input_shape=base.input_shape, num_classes=base.num_classes)
    )

    def data(input_context: Any) -> Any:
        return base(input_context).repeat()

    rounds = Rounds()
    straggler_logger = logging.getLogger(STRAGGLER_LOGGER)
    straggler_logger.setLevel(logging.INFO)
    straggler_logger.addHandler(rounds)
    sides, probes, trainers = {}, {}, {}
    for name in SIDES:
        sides[name], probes[name], trainers[name] = _side(strategy, builder, data, spec, name, gbs)
        sides[name].run(steps)  # untimed: traces, starts the pipelines
    recorder = Recorder()
    seconds: dict[str, list[float]] = {name: [] for name in SIDES}
    updates: dict[str, list[int]] = {name: [] for name in SIDES}
    seen: dict[str, list[dict[str, Any]]] = {name: [] for name in SIDES}
    for r in range(repeats):
        for name in ORDERS[r % 2]:
            before, scored, warned = sides[name].updates(), rounds.scored, rounds.warnings
            probes[name].seen = {}
            took, _ = recorder.measure(name, lambda s=sides[name]: s.run(steps))
            seconds[name].append(took)
            updates[name].append(sides[name].updates() - before)
            seen[name].append(
                {
                    **probes[name].seen,
                    "rounds_scored": rounds.scored - scored,
                    "straggler_warnings": rounds.warnings - warned,
                }
            )
    straggler_logger.removeHandler(rounds)
    return {
        "num_workers": workers,
        "global_batch_size": gbs,
        "steps": steps,
        "seconds": seconds,
        "updates": updates,
        "records": recorder.records,
        "observed": seen,
        "is_chief": trainers["off"].is_chief,
        "last_scores": rounds.last,
    }
