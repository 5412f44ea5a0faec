"""The straggler report's scores, in pure Python: who makes the others wait, and when it is over.

Each round gives every worker its seconds per update in one window; the report
scores the last three windows. What the tests hold to is the report's promise:
a worker is named when its work per update rose by ``threshold`` or is that much
above the others' while they wait for it, and only once per episode.
"""

import types

import pytest

from tfdist import _compat
from tfdist.training.health.monitor import Health
from tfdist.training.health.stragglers import StragglerOptions, StragglerReport
from tfdist.training.health.watchdog import WatchdogOptions

STEP = 0.03  # seconds per update (the workers run in lockstep: the same on every worker)


def _window(work, *, compute=0.0, step=STEP, updates=100.0):
    """One window's sums: input ``work - compute``, then compute, the wait and the step."""
    return {
        "updates": updates,
        "input": updates * (work - compute),
        "compute": updates * compute,
        "exchange": updates * (step - work),
        "total": updates * step,
    }


class Rounds:
    """Feeds a report one window per worker and round, as the chief reads them off the board."""

    def __init__(self, options=None):
        self.report = StragglerReport(options or StragglerOptions())
        self.window = 0
        self.named = []  # (round, warning)

    def run(self, count, *windows):
        for _ in range(count):
            self.window += 1
            before = len(self.report.warnings)
            self.report.tick(
                {
                    f"worker:{i}": {"host": f"host-{i}", "clock": {"window": self.window, **w}}
                    for i, w in enumerate(windows)
                }
            )
            self.named += [(self.window, m) for m in self.report.warnings[before:]]

    def names(self, label):
        return [m for _, m in self.named if m.startswith(f"Straggler: {label} ")]


def _caught_up(caplog, label):
    return [r for r in caplog.records if r.getMessage().startswith(f"Straggler: {label} caught up")]


def test_a_worker_that_slows_is_named_though_the_chief_is_always_slower(caplog):
    # The chief does 14 ms of work per update (its callbacks and logs), worker:1 10 ms. Then a
    # noisy neighbour takes worker:1's compute from 5 to 15 ms: 2x its own usual work, only 1.43x
    # the chief's. Scored against the fastest worker alone, it was never named.
    rounds = Rounds()
    rounds.run(8, _window(0.014, compute=0.009), _window(0.010, compute=0.005))
    assert rounds.named == []  # the chief, 1.4x the other, is under the threshold
    rounds.run(4, _window(0.014, compute=0.009), _window(0.020, compute=0.015))
    # Named at the fourth slow window: the first whose three-window sums are all slow, confirmed.
    assert [(r, m.split(" on ")[0]) for r, m in rounds.named] == [(12, "Straggler: worker:1")]
    assert rounds.named[0][1] == (
        "Straggler: worker:1 on host-1 computes in 15 ms against 9 ms per update; the others "
        "wait 20% of each step for it (score 1.43 against the others, 2.00 against its usual)."
    )
    # A long episode: its usual work is not learned from it, and it is named once.
    rounds.run(20, _window(0.014, compute=0.009), _window(0.020, compute=0.015))
    assert len(rounds.named) == 1 and rounds.report.scores["worker:1"][
        "individual"
    ] == pytest.approx(2.0)
    assert not _caught_up(caplog, "worker:1")
    rounds.run(5, _window(0.014, compute=0.009), _window(0.010, compute=0.005))
    assert len(_caught_up(caplog, "worker:1")) == 1
    assert rounds.names("worker:0") == []


def test_a_slowdown_that_comes_and_goes_is_one_episode_and_ends_once_clearly_over(caplog):
    # A neighbour that takes more or less of worker:1's CPU by turns: rounds under the threshold
    # (1.4x, costing the others 13% of each step), none under half of it. One warning, no
    # "caught up" until it is over; the bar to start an episode was also the bar to end it.
    rounds = Rounds()
    rounds.run(5, _window(0.010), _window(0.010))
    for _ in range(2):
        rounds.run(4, _window(0.010), _window(0.020))
        rounds.run(4, _window(0.010), _window(0.014))
    assert len(rounds.named) == 1 and not _caught_up(caplog, "worker:1")
    rounds.run(4, _window(0.010), _window(0.010))
    assert len(_caught_up(caplog, "worker:1")) == 1


def test_workers_slowed_alike_are_not_named():
    # The whole machine slows (both workers 2x their usual): nobody waits for anybody.
    rounds = Rounds()
    rounds.run(5, _window(0.010), _window(0.011))
    rounds.run(3, _window(0.020, step=0.06), _window(0.021, step=0.06))
    assert rounds.report.scores["worker:1"]["individual"] > 1.5  # slower than usual, costs nothing
    rounds.run(6, _window(0.020, step=0.06), _window(0.021, step=0.06))
    assert rounds.named == []
    # Outside an episode its usual work follows it: the new normal becomes its usual.
    assert rounds.report.scores["worker:1"]["individual"] < 1.1


class _Clock:
    """A worker's step clock: 100 updates of ``work`` seconds per window taken."""

    enabled = False

    def __init__(self, work):
        self.work = work

    def take(self):
        return _window(self.work())


@pytest.fixture
def shared_store(monkeypatch):
    """TF's coordination service's key-value store, as one dict for the tasks of this process."""
    store = {}
    monkeypatch.setattr(_compat, "coordination_service_enabled", lambda: True)
    monkeypatch.setattr(_compat, "op_determinism_enabled", lambda: False)
    monkeypatch.setattr(_compat, "key_value_set", store.__setitem__)
    monkeypatch.setattr(_compat, "key_value_get", lambda key, timeout_ms: store.get(key))
    return store


def test_the_chief_scores_every_window_whatever_the_phase_of_the_tasks_rounds(
    shared_store, monkeypatch
):
    # CLI defaults: rounds every second (the watchdog's poll), windows of 5 s. The chief's
    # thread runs its rounds 0.3 s before worker:1's. A round without a new window used to
    # replace the state that carried the last one: the chief never held both workers' windows,
    # and nothing was scored.
    now = [1000.0]
    fake_time = types.SimpleNamespace(time=lambda: now[0], monotonic=lambda: now[0])
    monkeypatch.setattr("tfdist.training.health.monitor.time", fake_time)
    slow = [False]

    def task(label, is_chief, work):
        runner = types.SimpleNamespace(task_label=label, is_chief=is_chief, step_clock=_Clock(work))
        return Health(
            runner,
            ["worker:0", "worker:1"],
            watchdog=WatchdogOptions(poll=1.0),
            stragglers=StragglerOptions(interval=5.0),
        )

    chief = task("worker:0", True, lambda: 0.010)
    other = task("worker:1", False, lambda: 0.025 if slow[0] else 0.010)
    assert chief.interval == 1.0
    for second in range(60):
        slow[0] = second >= 30
        now[0] = 1000.0 + second
        chief._round()
        now[0] += 0.3
        other._round()
    # 12 windows of 5 s; the first (the warm-up) is left out, and the last may be cut after the
    # chief's last round.
    assert chief.report._rounds == 10
    assert [w.split(" on ")[0] for w in chief.report.warnings] == ["Straggler: worker:1"]
