"""The progress watchdog and the straggler report: their rules, and single-process runs for real."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

import tfdist
from tests.helpers import REPO
from tfdist.config import STUCK_EXIT_CODE
from tfdist.training.health.monitor import check_health_options
from tfdist.training.health.stragglers import StragglerOptions, StragglerReport
from tfdist.training.health.watchdog import LearnedTimeouts, WatchdogOptions, blame

JOB = os.path.join(REPO, "tests", "jobs", "backup_job.py")


def test_a_section_gets_the_first_allowance_until_seen_then_a_learned_timeout():
    timeouts = LearnedTimeouts(WatchdogOptions(factor=5, floor=2, ceiling=100, first=60))
    assert timeouts.timeout("update") == 60  # the first call traces
    timeouts.observe("update", 30.0)  # a slow first trace
    assert timeouts.timeout("update") == 100  # 5 x 30 = 150, capped by the ceiling
    timeouts.observe("update", 0.01)
    # Once a second call was seen, the first (the trace) no longer counts: 5 x 0.01 -> floor.
    assert timeouts.timeout("update") == 2
    timeouts.observe("update", 1.0)
    assert timeouts.timeout("update") == 5
    assert timeouts.timeout("backup") == 60  # each section learns on its own


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"floor": 0}, "WatchdogOptions.floor"),
        ({"factor": 0.5}, "WatchdogOptions.factor"),
        ({"floor": 10, "ceiling": 5}, "WatchdogOptions.ceiling"),
        ({"first": float("inf")}, "WatchdogOptions.first"),
        ({"exit": "yes"}, "WatchdogOptions.exit"),
    ],
)
def test_bad_watchdog_options_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"argument `{field}`"):
        WatchdogOptions(**kwargs)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"threshold": 1.0}, "StragglerOptions.threshold"),
        ({"min_wait": 1.5}, "StragglerOptions.min_wait"),
        ({"interval": -1}, "StragglerOptions.interval"),
        ({"restart_after": 0}, "StragglerOptions.restart_after"),
    ],
)
def test_bad_straggler_options_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"argument `{field}`"):
        StragglerOptions(**kwargs)


def test_the_trainer_refuses_what_is_not_an_option_object_and_a_restart_without_a_backup():
    with pytest.raises(ValueError, match="argument `watchdog`"):
        check_health_options(30, None, None)
    with pytest.raises(ValueError, match="argument `stragglers`"):
        check_health_options(None, {"threshold": 2}, None)
    with pytest.raises(ValueError, match="give backup_dir= too"):
        check_health_options(None, StragglerOptions(restart_after=3), None)
    assert tfdist.WatchdogOptions is WatchdogOptions and tfdist.StragglerOptions is StragglerOptions


def _state(seq, section, update, *, published=100.0, py_function=False):
    return {
        "seq": seq,
        "section": section,
        "update": update,
        "for": 12.0,
        "host": "node-a",
        "published": published,
        "py_function": py_function,
    }


def test_blame_names_the_task_behind_then_a_python_stall_then_a_silent_one_or_none():
    behind = {"worker:0": _state(90, "vote", 22), "worker:1": _state(89, "callbacks", 21)}
    assert blame(behind, stale_after=5, now=101).startswith(
        "worker:1 on node-a is stuck in callbacks at update 21 for 12 s, while the others "
        "wait in vote"
    )
    python = {"worker:0": _state(50, "update", 9), "worker:1": _state(50, "update", 9)}
    python["worker:1"]["py_function"] = True
    assert blame(python, stale_after=5, now=101).startswith(
        "worker:1 on node-a is stuck in a tf.py_function"
    )
    frozen = {
        "worker:0": _state(50, "update", 9),
        "worker:1": _state(50, "update", 9, published=80),
    }
    assert "worker:1 on node-a stopped reporting 21 s ago" in blame(frozen, stale_after=5, now=101)
    even = {"worker:0": _state(50, "update", 9), "worker:1": _state(50, "update", 9)}
    assert blame(even, stale_after=5, now=101).startswith("every task waits in update at update 9")
    # The store gone with its task (the chief exited first): still a sentence, not an error.
    assert blame({}, stale_after=5, now=101).startswith("no task's state could be read")


def _round(report, works, *, step=0.05, exchange=None, window=None):
    """Feeds ``report`` one window per worker: seconds of input per update, 100 updates."""
    states = {}
    for i, work in enumerate(works):
        label = f"worker:{i}"
        window = window or report._seen.get(label, 0) + 1
        waited = step - work if exchange is None else exchange
        clock = {"window": window, "updates": 100.0, "input": 100 * work, "compute": 0.0}
        clock.update(exchange=100 * waited, total=100 * step)
        states[label] = {"host": f"host-{i}", "clock": clock}
    report.tick(states)


def test_a_slow_worker_is_named_once_per_episode_and_again_when_it_slows_further(tmp_path):
    report = StragglerReport(StragglerOptions(), summary_dir=str(tmp_path / "tb"))
    _round(report, [0.01, 0.011])  # warm-up: left out
    for _ in range(3):
        _round(report, [0.01, 0.011])  # balanced
    assert report.warnings == []
    for _ in range(4):
        _round(report, [0.01, 0.025], step=0.03)  # worker:1 reads its input 2.5x slower
    assert len(report.warnings) == 1  # once per episode
    # Named at the second slow round, over the last three windows (one balanced, two slow).
    assert re.match(
        r"Straggler: worker:1 on host-1 reads its input in 20 ms against 10 ms per update; the "
        r"others wait 2\d% of each step for it \(score 2\.\d+ against the others, 1\.\d+ "
        r"against its usual\)",
        report.warnings[0],
    ), report.warnings
    assert report.scores["worker:1"]["relative"] == pytest.approx(2.5, rel=0.2)
    for _ in range(3):  # slower still, in the same episode: its cost doubles, named again
        _round(report, [0.01, 0.1], step=0.105)
    assert len(report.warnings) == 2, report.warnings
    # The first round with a slower window already doubles the cost (smoothed: 50 ms).
    assert "reads its input in 50 ms against 10 ms per update" in report.warnings[1]
    for _ in range(5):  # the slow windows leave the last three, then two fast rounds confirm
        _round(report, [0.01, 0.01])
    assert not report._episodes  # caught up
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "tb"))


def test_a_slow_worker_that_costs_the_others_little_is_not_reported():
    report = StragglerReport(StragglerOptions())
    for _ in range(6):  # 3x the fastest worker's input, but 0.2 ms of a 50 ms step
        _round(report, [0.0001, 0.0003])
    assert report.warnings == [] and not report.stop_requested


def test_restart_after_asks_to_stop_once_an_episode_lasts_that_many_rounds():
    report = StragglerReport(StragglerOptions(restart_after=3))
    _round(report, [0.01, 0.01])
    for rounds in range(1, 6):
        _round(report, [0.01, 0.04])
        if rounds < 4:  # the episode starts at the 2nd slow round, stops at its 3rd
            assert not report.stop_requested
    assert report.stop_requested


def _job(out, *extra):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO}
    env.pop("TF_CONFIG", None)
    return subprocess.run(
        [sys.executable, JOB, "one_device", str(out), str(out / "backup"), *extra],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )


@pytest.mark.multiprocess
def test_no_false_alarm_on_a_slow_first_trace_or_slow_saves(tmp_path):
    # Timeouts of 7 s (floor), 5 x the longest seen: each trace takes 7.5 s (over the floor, under
    # the first allowance) and the first two saves 7.5 s each (the first under the allowance, the
    # second under 5 x the first). 48 updates, a backup every 2. (Floors of 2 s and 4 s each
    # fired once under a doubly loaded suite: an epoch's iterator took over 4 s to make.)
    proc = _job(tmp_path, "--watchdog=7,5", "--slow_trace=7.5", "--slow_saves=7.5,2")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "watchdog" not in proc.stdout
    assert json.loads((tmp_path / "worker-0.json").read_text())["iterations"] == 48


@pytest.mark.multiprocess
def test_a_hang_without_a_backup_ends_with_the_stuck_code_a_clear_error_and_the_stacks(tmp_path):
    # Bound: the callback section's timeout is the 2 s floor; the check runs every 0.5 s.
    proc = _job(tmp_path, "--watchdog=2,5", "--no_backup", "--faults=callback:worker-0:5")
    assert proc.returncode == STUCK_EXIT_CODE, proc.stdout[-3000:]
    assert "tfdist watchdog on worker:0" in proc.stdout
    assert "no progress in callbacks at update 4 for 2 s; its timeout is 2 s" in proc.stdout
    assert "which starts over: this fit has no backup_dir" in proc.stdout
    # The stacks of all threads: the main thread is where the callback blocks.
    assert "in inject" in proc.stdout and "in on_train_batch_end" in proc.stdout


def test_the_cli_flags_become_the_option_objects_and_bad_ones_name_the_flag():
    from tfdist.config import TrainConfig
    from tfdist.launch.train import health_options

    assert health_options(TrainConfig()) == {}  # the Trainer's defaults
    assert health_options(TrainConfig(stragglers="on")) == {"stragglers": StragglerOptions()}
    options = health_options(TrainConfig(watchdog="floor=60,factor=5,exit=false", stragglers="off"))
    assert options == {
        "watchdog": WatchdogOptions(floor=60.0, factor=5.0, exit=False),
        "stragglers": None,
    }
    assert health_options(TrainConfig(stragglers="interval=2,log_scores=true"))["stragglers"] == (
        StragglerOptions(interval=2.0, log_scores=True)
    )
    with pytest.raises(
        ValueError, match=r"argument `watchdog`.*'on', or key=value pairs of: factor, floor"
    ):
        TrainConfig(watchdog="timeout=60")
    with pytest.raises(ValueError, match=r"argument `stragglers`.*restart_after= to be an integer"):
        TrainConfig(stragglers="restart_after=soon")
    with pytest.raises(ValueError, match="set backup_dir"):
        TrainConfig(stragglers="restart_after=3")
    with pytest.raises(ValueError, match=r"argument `WatchdogOptions.floor`"):
        health_options(TrainConfig(watchdog="floor=-1"))


def test_on_parameter_servers_the_watchdog_numbers_time_each_workers_calls():
    from tfdist.strategies.ps.runner import PSRunner
    from tfdist.training.health.monitor import fit_health

    class Watch:
        timeouts, checking = None, True

    class Runner:  # what fit_health reads of a PSRunner
        task_label, is_chief, loop_tasks = "chief:0", True, ["chief:0"]
        watched_sections = PSRunner.watched_sections
        watch = Watch()

        def worker_update_rates(self, *, log=False):
            return {"worker:0": 2.0}

    runner = Runner()
    options = WatchdogOptions(factor=4, floor=30, ceiling=600, first=900)
    health = fit_health(
        runner, watchdog=options, stragglers=StragglerOptions(), callbacks=[], has_backup=False
    )
    assert runner.watch.timeouts is options and runner.watch.checking
    # The coordinator waits for workers in these; the runner finds a stuck worker there.
    assert health.unwatched == {"update", "evaluate"}
    assert health.rates is not None and health.report is None  # rates, not the MWMS scores
    # watchdog=None turns the stuck-worker check off too.
    fit_health(runner, watchdog=None, stragglers=None, callbacks=[], has_backup=False)
    assert not runner.watch.checking


def test_a_failed_round_is_logged_once_and_the_next_rounds_go_on(caplog):
    from tfdist.training.health.monitor import Health

    class Runner:
        task_label, is_chief = "worker:0", True

    health = Health(Runner(), ["worker:0"], watchdog=WatchdogOptions(poll=0.02), stragglers=None)
    put, calls = health.board.put, []

    def flaky_put(key, value):  # the store unreachable for three rounds, say
        calls.append(key)
        if len(calls) <= 3:
            raise RuntimeError("store unreachable")
        put(key, value)

    health.board.put = flaky_put
    with health:
        while health.board.get("task/worker:0") is None:
            time.sleep(0.02)
    failed = [r for r in caplog.records if "a round failed" in r.getMessage()]
    assert [r.getMessage() for r in failed] == [
        "tfdist health on worker:0: a round failed (store unreachable)."
    ]


def test_the_first_claim_of_a_key_wins_and_the_later_ones_read_it():
    from tfdist.training.health.board import Board

    board = Board(["worker:0", "worker:1"], shared=False)
    assert board.claim("fired", {"by": "worker:1"}) is None
    assert board.claim("fired", {"by": "worker:0"}) == {"by": "worker:1"}
    assert board.get("fired") == {"by": "worker:1"}


def test_a_window_left_by_an_earlier_fit_does_not_hide_this_fits_windows():
    report = StragglerReport(StragglerOptions())
    stale = {"window": 40, "updates": 10.0, "input": 0.1, "compute": 0.0, "exchange": 0.1}
    stale["total"] = 0.5
    report.tick({f"worker:{i}": {"host": "h", "clock": dict(stale)} for i in range(2)})
    for window in range(1, 5):  # this fit's windows count from 1 again
        _round(report, [0.01, 0.01], window=window)
    assert report._rounds == 4


def test_a_parameter_server_fit_ended_by_a_stuck_worker_exits_with_the_stuck_code(tmp_path):
    # What a launched coordinator does with WorkerStuckError (no worker left to run a call):
    # stacks, the reason, exit 76 for the launcher's restart. The fit itself is
    # tests/strategies/test_ps_watchdog.py's; here the exit, in a real process.
    script = tmp_path / "coordinator.py"
    script.write_text(
        "from tfdist.training.health.monitor import fit_health\n"
        "from tfdist.training.health.watchdog import WatchdogOptions\n"
        "from tfdist.strategies.ps.failures import WorkerStuckError\n"
        "class Watch:\n"
        "    timeouts, checking = None, True\n"
        "class Runner:\n"
        "    task_label, is_chief, loop_tasks = 'chief:0', True, ['chief:0']\n"
        "    watched_sections = ('update', 'evaluate')\n"
        "    watch = Watch()\n"
        "    def worker_update_rates(self, *, log=False):\n"
        "        return {}\n"
        "health = fit_health(Runner(), watchdog=WatchdogOptions(), stragglers=None, callbacks=[],"
        " has_backup=True)\n"
        "with health:\n"
        "    raise WorkerStuckError('worker:1 is stuck: its training call has run for 9 s')\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == STUCK_EXIT_CODE, done.stderr[-2000:]
    assert "worker:1 is stuck: its training call has run for 9 s" in done.stderr
    assert "resumes from the last backup" in done.stderr
    assert "most recent call first" in done.stderr  # the stacks
