"""The straggler report: which worker makes the others wait, in which section, at what cost.

Every worker times each update in its train loop (input wait, compute up to
the exchange, wait for the exchange; see `tfdist.strategies.step_clock`)
and publishes the sums of each window of ``interval`` seconds (wall-clock
windows, the same on every worker). The chief's `StragglerReport` turns each
round into scores, as NVIDIA's nvidia-resiliency-ext does for PyTorch. A
worker's **work** per update is its input wait and its compute up to the
exchange: what the others wait for in the exchange. Its scores:

* **relative**: its work over the others' (their median);
* **individual**: its work over its own usual work, the median of its last
  `BASELINE_ROUNDS` rounds outside an episode (after `MIN_BASELINE` rounds;
  1 before). This one sees a worker that slows down while another one is
  always slower (the chief, say, with its callbacks and logs).

A worker whose relative or individual score reaches ``threshold`` while it
costs the others at least ``min_wait`` of each step (its work beyond the
others', over the step), two rounds in a row, is a straggler (each round
scores the last three windows; each worker's first, which holds its warm-up,
is left out). Its episode lasts until two rounds in a row fall below half of
that (scores under ``1 + (threshold - 1) / 2`` or a cost under ``min_wait / 2``),
so that a noisy neighbour that slows it by turns is one episode. The report
warns at an episode's start, naming the worker, its host, the slow section and
what it costs everyone, warns again if that cost doubles (a worker already slow
that slows further), and says when it catches up. The scores go to
TensorBoard scalars (under ``summary_dir``) and, with ``log_scores``, to the
log every round. With ``restart_after``, an episode that lasts that many
rounds stops the run as a SIGTERM would: every worker saves a backup and exits
with code 75, so that the scheduler restarts the job, without that node where
it can.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from tfdist.config import (
    PREEMPTED_EXIT_CODE,
    check_positive_int,
    check_positive_number,
    invalid_argument,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StragglerOptions:
    """How the chief finds and reports a slow worker (synchronous multi-worker runs).

    Attributes:
        interval: Seconds between rounds (each worker's sums since the last one).
        threshold: Score (work per update over the others', or over its own
            usual) from which a worker counts as slow.
        min_wait: Fraction of each step the others must lose to it, for it to
            count: its work per update beyond the others', over the step time
            (a ratio of tiny times costs nothing and is not reported).
        log_scores: Also log every worker's scores each round (INFO).
        restart_after: Stop the run for a restart once an episode lasts this
            many rounds (needs a backup); None never stops.
    """

    interval: float = 5.0
    threshold: float = 1.5
    min_wait: float = 0.1
    log_scores: bool = False
    restart_after: int | None = None

    def __post_init__(self) -> None:
        check_positive_number("StragglerOptions.interval", self.interval)
        check_positive_number("StragglerOptions.threshold", self.threshold)
        if self.threshold <= 1:
            raise invalid_argument("StragglerOptions.threshold", self.threshold, "a number > 1")
        if isinstance(self.min_wait, bool) or not 0 <= self.min_wait < 1:
            raise invalid_argument("StragglerOptions.min_wait", self.min_wait, "a number in [0, 1)")
        check_positive_int("StragglerOptions.restart_after", self.restart_after, allow_none=True)


#: Rounds a worker must be slow (or fast again) in a row before an episode starts (or ends).
CONFIRM = 2
#: Windows per worker summed into each round's scores.
SMOOTHING = 3
#: A worker's usual work per update: the median of its last this many rounds outside an episode.
BASELINE_ROUNDS = 12
#: Rounds outside an episode before the individual score counts (1 until then).
MIN_BASELINE = 3

#: The Trainer's default straggler report.
DEFAULT_STRAGGLERS = StragglerOptions()


def per_update(clock: Mapping[str, float]) -> dict[str, float] | None:
    """A round's sums as seconds per update (None for a round without updates).

    Adds ``work`` (input + compute: what the worker does itself before the
    exchange, timed in its graph, with no wait for another worker in it) and
    ``wait_fraction`` (the share of the step spent in the exchange).
    """
    updates = clock.get("updates", 0.0)
    if not updates or updates <= 0:
        return None
    sections = {k: clock[k] / updates for k in ("input", "compute", "exchange", "total")}
    compute = sections["compute"] if math.isfinite(sections["compute"]) else 0.0
    sections["work"] = sections["input"] + compute
    exchange = sections["exchange"]
    waited = exchange if math.isfinite(exchange) else sections["total"] - sections["work"]
    sections["wait_fraction"] = max(waited, 0.0) / sections["total"] if sections["total"] else 0.0
    return sections


def _summed(windows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    return {
        k: sum(w[k] for w in windows) for k in ("updates", "input", "compute", "exchange", "total")
    }


def _slow_section(label: str, rounds: Mapping[str, dict[str, float]]) -> tuple[str, float, float]:
    """(verb, this worker's seconds, the others' median) for the section it is slowest in."""
    others = [r for other, r in rounds.items() if other != label]
    best = None
    for section, verb in (("input", "reads its input"), ("compute", "computes")):
        mine = rounds[label][section]
        if not math.isfinite(mine):
            continue
        theirs = statistics.median(r[section] for r in others)
        if best is None or mine - theirs > best[1] - best[2]:
            best = (verb, mine, theirs)
    return best


class StragglerReport:
    """The chief's scores over the workers' rounds; warns once per episode.

    Args:
        options: The report's options.
        summary_dir: Where to write TensorBoard scalars, or None.

    Attributes:
        scores: Worker label -> its last ``{"relative", "individual", "cost", ...}``.
        stop_requested: Set once an episode lasted ``options.restart_after`` rounds.
    """

    def __init__(self, options: StragglerOptions, *, summary_dir: str | None = None) -> None:
        self.options = options
        self.summary_dir = summary_dir
        self.scores: dict[str, dict[str, float]] = {}
        self.stop_requested = False
        self.warnings: list[str] = []
        self._seen: dict[str, int] = {}
        self._usual: dict[str, collections.deque] = {}
        self._episodes: dict[str, int] = {}
        self._warned_cost: dict[str, float] = {}
        self._slow_rounds: dict[str, int] = {}
        self._fast_rounds: dict[str, int] = {}
        self._recent: dict[str, collections.deque] = {}
        self._rounds = 0
        self._writer: Any = None

    def tick(self, states: Mapping[str, Mapping[str, Any]]) -> None:
        """Scores a round once every worker has published new sums since the last one.

        Each worker's first sums (tracing, warm-up) are left out, and a round
        scores the sums of each worker's last `SMOOTHING` windows, so
        that windows the workers cut at slightly different moments compare fairly.
        """
        fresh = {
            label: s
            for label, s in states.items()
            # "Differs", not "is larger": a fit before this one (same store) may have left a
            # window with a larger number than this fit's first ones.
            if "clock" in s and s["clock"]["window"] != self._seen.get(label)
        }
        if len(fresh) < 2 or len(fresh) < len(states):
            return
        for label, s in fresh.items():
            first = label not in self._seen
            self._seen[label] = s["clock"]["window"]
            if not first:
                self._recent.setdefault(label, collections.deque(maxlen=SMOOTHING))
                self._recent[label].append(s["clock"])
        sums = {label: _summed(windows) for label, windows in self._recent.items()}
        rounds = {label: per_update(c) for label, c in sums.items() if label in fresh}
        rounds = {label: r for label, r in rounds.items() if r is not None}
        if len(rounds) >= 2:
            self.score({label: {**r, "host": fresh[label]["host"]} for label, r in rounds.items()})

    def score(self, rounds: Mapping[str, dict[str, Any]]) -> None:
        """Scores one round: worker label -> its seconds per update (`per_update`) and ``host``."""
        self._rounds += 1
        for label, r in rounds.items():
            others = statistics.median(o["work"] for other, o in rounds.items() if other != label)
            usual = self._usual.get(label, ())
            baseline = statistics.median(usual) if len(usual) >= MIN_BASELINE else 0.0
            self.scores[label] = {
                "relative": r["work"] / others if others > 0 else 1.0,
                "individual": r["work"] / baseline if baseline > 0 else 1.0,
                "wait_fraction": r["wait_fraction"],
                # What the others lose to it: its work beyond theirs, per step.
                "cost": max(r["work"] - others, 0.0) / r["total"] if r["total"] > 0 else 0.0,
                **{f"{k}_ms": r[k] * 1e3 for k in ("input", "compute", "exchange", "total")},
            }
        for label in sorted(rounds):
            self._episode(label, rounds)
            if not self._episodes.get(label) and not self._slow_rounds.get(label):
                # Its usual work: rounds in which it was not slow, so that an episode (and the
                # round before it) does not become the baseline it is measured against.
                self._usual.setdefault(label, collections.deque(maxlen=BASELINE_ROUNDS))
                self._usual[label].append(rounds[label]["work"])
        self._publish()

    def _is_slow(self, label: str) -> bool:
        """Whether ``label``'s last scores count as slow; in an episode, at half the bar."""
        s, o = self.scores[label], self.options
        score = max(s["relative"], s["individual"])
        if self._episodes.get(label):
            return score >= 1 + (o.threshold - 1) / 2 and s["cost"] >= o.min_wait / 2
        return score >= o.threshold and s["cost"] >= o.min_wait

    def _episode(self, label: str, rounds: Mapping[str, dict[str, Any]]) -> None:
        """Counts ``label``'s slow rounds; an episode starts and ends after CONFIRM rounds."""
        s, o = self.scores[label], self.options
        if not self._is_slow(label):
            self._slow_rounds[label] = 0
            self._fast_rounds[label] = self._fast_rounds.get(label, 0) + 1
            if self._fast_rounds[label] >= CONFIRM and self._episodes.pop(label, 0):
                logger.warning(
                    "Straggler: %s caught up (score %.2f against the others, %.2f against its "
                    "usual).",
                    label,
                    s["relative"],
                    s["individual"],
                )
            return
        self._fast_rounds[label] = 0
        self._slow_rounds[label] = self._slow_rounds.get(label, 0) + 1
        if self._slow_rounds[label] < CONFIRM and not self._episodes.get(label):
            return
        self._episodes[label] = self._episodes.get(label, 0) + 1
        if self._episodes[label] == 1 or s["cost"] >= 2 * self._warned_cost[label]:
            self._warned_cost[label] = s["cost"]
            self._warn(label, rounds)
        if o.restart_after is not None and self._episodes[label] >= o.restart_after:
            if not self.stop_requested:
                logger.warning(
                    "Straggler: %s has been slow for %d rounds; stopping every worker at the next "
                    "update to save a backup and exit with code %d, so that the scheduler restarts "
                    "the job (exclude host %s there if it can).",
                    label,
                    self._episodes[label],
                    PREEMPTED_EXIT_CODE,
                    rounds[label]["host"],
                )
            self.stop_requested = True

    def _warn(self, label: str, rounds: Mapping[str, dict[str, Any]]) -> None:
        s = self.scores[label]
        verb, mine, theirs = _slow_section(label, rounds)
        message = (
            f"Straggler: {label} on {rounds[label]['host']} {verb} in {mine * 1e3:.0f} ms "
            f"against {theirs * 1e3:.0f} ms per update; the others wait "
            f"{s['cost']:.0%} of each step for it (score {s['relative']:.2f} against the "
            f"others, {s['individual']:.2f} against its usual)."
        )
        self.warnings.append(message)
        logger.warning(message)

    def _publish(self) -> None:
        if self.options.log_scores:
            logger.info(
                "Straggler scores: %s",
                "; ".join(
                    f"{label} relative {s['relative']:.2f}, individual {s['individual']:.2f}, "
                    f"costs the others {s['cost']:.0%}, waits {s['wait_fraction']:.0%} "
                    f"(ms per update: input {s['input_ms']:.1f}, "
                    f"compute {s['compute_ms']:.1f}, exchange {s['exchange_ms']:.1f}, "
                    f"step {s['total_ms']:.1f})"
                    for label, s in sorted(self.scores.items())
                ),
            )
        if self.summary_dir is None:
            return
        import tensorflow as tf

        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.summary_dir)
        with self._writer.as_default(step=self._rounds):
            for label, s in self.scores.items():
                for name in ("relative", "individual", "cost", "wait_fraction"):
                    tf.summary.scalar(f"stragglers/{name}/{label.replace(':', '_')}", s[name])
        self._writer.flush()
