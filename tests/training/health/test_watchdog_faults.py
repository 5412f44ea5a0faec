"""Stuck and slow workers, for real: two MultiWorkerMirrored workers under ``tfdist launch``.

One launch lives through four hangs in a row, each in a fresh attempt that
resumed from the last backup: a worker blocked in a callback, a worker whose
input pipeline's ``tf.py_function`` never returns, the chief blocked inside a
backup save, and a worker frozen with SIGSTOP. Each must be found (by the
watchdog, or by TF's heartbeats for the frozen one), the group restarted, and
the run must end bitwise equal to one that never hung. Another launch slows
one worker's input pipeline halfway through and checks that the straggler
report names it, and only then. A third, ``tfdist train`` as a user runs it,
gets a noisy neighbour: a CPU hog on worker:1's core.
"""

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tests.helpers import PRELOAD, REPO, launch_backup_job, launch_report, npz_weights

JOB = os.path.join(REPO, "tests", "jobs", "backup_job.py")
pytestmark = [pytest.mark.multiprocess, pytest.mark.fault, pytest.mark.slow]

FLOOR = 8  # the watchdog's floor in these runs, in seconds (factor 5: steps take milliseconds)
#: The longest a hang may go unnoticed here: the floor, a check every second, the 2.5 s the
#: finder waits for the others' last states, and the exits.
RESTART_BOUND = FLOOR + 20
FAULTS = (
    ("callback", "worker-1", 10),
    ("input", "worker-1", 18),
    ("save", "worker-0", 28),
    ("frozen", "worker-1", 38),
)


def _launch(out, *extra, restarts=0, preload=True):
    """The backup job under ``tfdist launch --workers=2``, its tasks forked from a preloaded Python.

    ``preload=False`` (the slowed-input test) starts each task afresh: under preload the slowed
    worker's input gap came out smaller (12 against 8 ms, then 4 against 2 ms, in two suite
    runs; never without it). Not understood yet: a task forked from the preloaded Python may
    keep values TF computed at import, e.g. from the CPUs it saw then. The hangs do not depend
    on such timings, and preloading saves each of their seven task starts a TF import.
    """
    return launch_backup_job(
        out, out / "backup", *extra, restarts=restarts, timeout=600, preload=preload
    )


_weights = npz_weights


@pytest.fixture(scope="module")
def four_hangs(tmp_path_factory):
    out = tmp_path_factory.mktemp("hangs")
    faults = ",".join(f"{kind}:{task}:{update}" for kind, task, update in FAULTS)
    proc = _launch(out, f"--faults={faults}", f"--watchdog={FLOOR},5", restarts=len(FAULTS))
    assert proc.returncode == 0, launch_report(proc, 5000)
    return out, proc.stdout


@pytest.fixture(scope="module")
def never_hung(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    proc = _launch(out, f"--watchdog={FLOOR},5")  # also: no false alarm over a whole run
    assert proc.returncode == 0, launch_report(proc, 3000)
    assert "watchdog" not in proc.stdout
    return [_weights(out / f"worker-{i}.npz") for i in range(2)]


def _restart_delay(log, kind):
    """Seconds from ``kind``'s fault to the launcher's next group restart."""
    fault = re.search(rf"{kind} fault after update \d+ at ([\d.]+)", log)
    assert fault, log[-3000:]
    started = float(fault.group(1))
    after = log[fault.end() :]
    restart = re.search(r"^W\d{4} (\d\d:\d\d:\d\d\.\d+) .*restarting the whole group", after, re.M)
    assert restart, after[-3000:]
    day = datetime.datetime.fromtimestamp(started).date()
    at = datetime.datetime.combine(day, datetime.time.fromisoformat(restart.group(1)))
    return (at.timestamp() - started) % 86400


def _found(log, text):
    assert text in log, log[-5000:]


def test_a_worker_blocked_in_a_callback_is_named_and_the_group_restarts(four_hangs):
    _, log = four_hangs
    _found(log, "Stuck: worker:1 on ")
    _found(log, " is stuck in callbacks at update 9 for ")
    assert re.search(r"no progress in (vote|callbacks) at update \d+ for \d+ s", log)
    _found(log, "exited with code 76; restarting the whole group (restart 1 of 4)")
    assert _restart_delay(log, "callback") < RESTART_BOUND


def test_a_worker_stuck_in_its_input_pipeline_is_named(four_hangs):
    _, log = four_hangs
    _found(log, "worker-1 input pipeline stuck")
    _found(log, "is stuck in a tf.py_function (its input pipeline's Python, say) in update")
    _found(log, "(restart 2 of 4)")
    assert _restart_delay(log, "input") < RESTART_BOUND


def test_the_chief_stuck_in_a_backup_save_is_named(four_hangs):
    _, log = four_hangs
    _found(log, "worker-0 stuck in the backup save at update 28")
    _found(log, "Stuck: worker:0 on ")
    _found(log, " is stuck in backup at update 28 for ")
    _found(log, "(restart 3 of 4)")
    assert _restart_delay(log, "save") < RESTART_BOUND


def test_a_frozen_worker_stops_the_group_and_it_restarts(four_hangs):
    _, log = four_hangs
    _found(log, "worker-1 frozen fault after update 38")
    # TF's heartbeats or the watchdog (a task that stopped reporting), whichever comes first.
    assert "stopped sending heartbeats" in log or "stopped reporting" in log, log[-4000:]
    _found(log, "(restart 4 of 4)")
    assert _restart_delay(log, "frozen") < RESTART_BOUND + 30  # TF's heartbeat timeout


def test_every_stack_is_dumped_and_each_attempt_resumes_where_the_backup_stood(four_hangs):
    out, log = four_hangs
    # Each task dumps its stacks before the group restarts, in the first three hangs: the one
    # finding it, and the other, told through the store. (A frozen worker-1 cannot; TF's
    # heartbeats may stop worker-0 before its watchdog fires.)
    attempts = re.split(r"^W\d{4} .*restarting the whole group.*$", log, flags=re.M)
    assert len(attempts) == 5, log[-3000:]
    for attempt in attempts[:3]:
        for i in (0, 1):
            assert re.search(rf"^\[worker:{i}\] .*Python stacks of all threads", attempt, re.M), (
                f"no stacks from worker:{i}",
                attempt[-3000:],
            )
    # The backups (every 2 updates) before each fault. Backups are committed in the background:
    # one still being written when the group stops is lost, and the attempt resumes at the one
    # before (which the bitwise test below checks is exact too).
    for update in (10, 20, 26, 38):
        resumed = rf"resuming at epoch \d, micro-batch \d+ \(({update}|{update - 2}) updates done\)"
        assert re.search(resumed, log), log[-3000:]
    assert json.loads((out / "worker-0.json").read_text())["attempt"] == 5


def test_after_four_hangs_the_weights_equal_a_run_that_never_hung_bitwise(four_hangs, never_hung):
    out, _ = four_hangs
    for i in range(2):
        for a, b in zip(_weights(out / f"worker-{i}.npz"), never_hung[i]):
            np.testing.assert_array_equal(a, b)


def _input_gap(message):
    """The ms per update a straggler warning says the worker waits for input beyond the others."""
    found = re.search(r"reads its input in (\d+) ms against (\d+) ms per update", message)
    if not found:  # another section named slow: not a claim about the input
        return 0
    mine, others = (int(v) for v in found.groups())
    return mine - others


def test_a_worker_slowed_in_its_input_pipeline_is_named_and_only_then(tmp_path):
    # Every worker reads an example in 0.2 ms (hidden by prefetching); from update 96 of 160,
    # worker-1 takes 8 ms: 16 examples, 125 ms more per update, several times its step (with 4 ms,
    # an episode's one warning, scored from windows partly before the slow-down, said 25 against
    # 11 ms once in a loaded suite, under the 20 ms checked below). Rounds
    # every 0.5 s; the report scores the last three windows and needs two slow rounds: 5 s on
    # a quiet machine, bound 10 s (a loaded suite delays the rounds).
    # With restart_after=4 the run then saves a backup and exits 75; the restarted attempt (no
    # longer slowed) finishes.
    proc = _launch(
        tmp_path,
        "--slow_input=0.0002,0.008",
        "--slow_from=96",
        "--straggler_interval=0.5",
        "--straggler_restart_after=4",
        "--epochs=10",
        "--sharding=gradients",  # the report times the sharded exchange (reduce-scatter) alike
        preload=False,
    )
    assert proc.returncode == 0, launch_report(proc, 3000)
    assert "has been slow for 4 rounds; stopping every worker" in proc.stdout
    assert "preempted after saving a backup; restarting the whole group" in proc.stdout
    info = json.loads((tmp_path / "worker-0.json").read_text())
    assert (info["attempt"], info["iterations"]) == (2, 160)
    slowed = float((tmp_path / "worker-0.slowed").read_text())
    lines = (tmp_path / "worker-0.stragglers").read_text().splitlines()
    warnings = [json.loads(line) for line in lines]
    named = [w for w in warnings if w["message"].startswith("Straggler: worker:1 ")]
    # Before it is slowed, nothing blames worker:1 for a gap near the slow-down's size. Tiny
    # steps make tiny gaps count: a loaded machine can really slow either worker's input by
    # a few ms for a while (seen: 15 against 7 ms), and the report then rightly says so.
    before = [w for w in named if w["time"] <= slowed]
    assert all(_input_gap(w["message"]) < 20 for w in before), warnings
    # The first warning after the slow-down may still score windows from before it (seen under
    # load: 12 against 8 ms, a round later the full gap). An episode that a loaded machine started
    # before the slow-down (seen in CI: a small gap, then only the restart) warns again once the
    # cost doubles: the claim is the named gap, in time.
    after = [w for w in named if w["time"] > slowed]
    warning = next((w for w in after if _input_gap(w["message"]) >= 20), None)
    assert warning is not None, after
    assert warning["time"] - slowed < 10.0, proc.stdout[-3000:]  # 5 s quiet; rounds lag under load
    assert re.match(
        r"Straggler: worker:1 on \S+ reads its input in \d+ ms against \d+ ms per update; the "
        r"others wait \d+% of each step for it",
        warning["message"],
    ), warning
    assert "Straggler scores: worker:0 relative" in proc.stdout  # log_scores: every round


#: ``tfdist train`` with the CLI's defaults (cnn on digits, 32 updates per call, a log line per
#: epoch), but the straggler report's clock 10x faster: windows of 0.5 s (default 5 s), rounds
#: every 0.1 s (the watchdog's poll, default 1 s), so that a window spans five rounds as by
#: default.
NOISY_NEIGHBOUR_TRAIN = (
    "train",
    "--strategy=multi_worker",
    "--epochs=1000",
    "--steps_per_epoch=50",
    "--stragglers=interval=0.5,log_scores=true",
    "--watchdog=poll=0.1",
)
#: Rounds scored before the hog starts: the warm-up window is left out, then 3 build each
#: worker's usual work.
ROUNDS_BEFORE_HOG = 5
#: The longest the hog runs: worker:1 must be named by then (16 rounds of 0.5 s).
HOG_SECONDS = 8.0
#: Busy loops per CPU of worker:1, each in its own session: Linux's autogroup scheduling shares a
#: core between sessions, not processes. One takes half of the core from a worker that is busy
#: all the time, less from one that waits half of each step; on a machine shared with other
#: jobs, their unpinned processes then move to the other core and slow worker:0 about as much
#: (seen beside another job's tests: worker:1 not named in 8 s). Two keep worker:1 the slowest.
HOGS_PER_CPU = 4


def _cpus(text):
    """``"1"``, ``"2-3"`` or ``"0,2"`` (`tfdist.launch.pinning.cpu_list`) as a list of ids."""
    cpus = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus += range(int(first), int(last or first) + 1)
    return cpus


class _Output:
    """The launch's output lines as they come, each with the monotonic time it was read."""

    def __init__(self, proc):
        self.lines = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc):
        for line in proc.stdout:
            self.lines.append((time.monotonic(), line))

    def text(self):
        return "".join(line for _, line in self.lines)

    def wait_for(self, found, seconds):
        """The first value of ``found(lines)`` that is not None, polled for ``seconds``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            value = found(list(self.lines))
            if value is not None:
                return value
            time.sleep(0.05)
        return found(list(self.lines))


def _named(lines, label, since=0.0, until=float("inf")):
    """When each line from ``since`` to ``until`` named ``label`` a straggler (not "caught up")."""
    return [t for t, x in lines if since <= t <= until and f"Straggler: {label} on " in x]


def _in_episode_at(lines, label, at):
    """Whether ``label``'s last straggler line before ``at`` named it (no "caught up" after)."""
    events = [x for t, x in lines if t < at and f"Straggler: {label} " in x]
    return bool(events) and f"Straggler: {label} on " in events[-1]


def _start_noisy_neighbour_run():
    """``tfdist launch --workers=2 -- tfdist train`` (`NOISY_NEIGHBOUR_TRAIN`), output read."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TF_CONFIG", None)
    command = [sys.executable, "-m", "tfdist", "launch", "--workers=2", PRELOAD, "--"]
    command += [sys.executable, "-m", "tfdist", *NOISY_NEIGHBOUR_TRAIN]
    proc = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return proc, _Output(proc)


def test_a_worker_beside_a_noisy_neighbour_is_named_while_it_runs():
    """A CPU hog pinned to worker:1's core: worker:1 is named while it runs, worker:0 never.

    ``tfdist launch --workers=2`` pins each worker to its own core, and the hog
    (``while True: pass``) takes its share of worker:1's. Bound: named within
    16 rounds of 0.5 s (8 s) of the hog's start; measured 1.5-3 s on the 2-core
    AMD EPYC, with other tests beside it. Each round scores the last three windows
    and an episode needs two slow rounds: 4 rounds once the hog fills the windows.
    A shared machine may have slowed either worker before (another job on its core,
    another test's workers: seen, worker:0 computing in 5.4 against 2.2 ms under a
    benchmark's two workers, and rightly named). So: an episode of worker:1 already
    under way must last while the hog runs, and worker:0 must not be named while it
    runs once worker:1 is named, when the others wait for worker:1.
    """
    proc, out = _start_noisy_neighbour_run()
    hogs = []
    try:
        pinned = out.wait_for(
            lambda lines: next(
                (
                    re.search(r"worker:1 -> cpus ([\d,-]+) ", x)
                    for _, x in lines
                    if "worker:1 -> " in x
                ),
                None,
            ),
            60,
        )
        if pinned is None:
            pytest.skip(f"worker:1 has no core of its own: {out.text()[-1000:]}")
        scored = out.wait_for(
            lambda lines: (
                sum("Straggler scores:" in x for _, x in lines) >= ROUNDS_BEFORE_HOG or None
            ),
            300,
        )
        assert scored, launch_report(subprocess.CompletedProcess([], None, out.text()), 5000)
        started = time.monotonic()
        for cpu in _cpus(pinned.group(1)) * HOGS_PER_CPU:
            hog = [sys.executable, "-c", "while True: pass"]
            hogs.append(subprocess.Popen(hog, start_new_session=True))
            os.sched_setaffinity(hogs[-1].pid, {cpu})
        out.wait_for(lambda lines: (_named(lines, "worker:1", started) or [None])[0], HOG_SECONDS)
        stopped = time.monotonic()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    lines = list(out.lines)
    scores = "".join(x for _, x in lines if "Straggler" in x)
    named = _named(lines, "worker:1", started)
    if named:
        print(f"worker:1 named {named[0] - started:.1f} s after the hog started")
        assert named[0] - started < HOG_SECONDS, scores
    else:  # already named before the hog: the episode must not have ended meanwhile
        assert _in_episode_at(lines, "worker:1", stopped), scores[-6000:]
    # Until the hog bites, worker:0 may still be named for a slowness of its own (seen in CI:
    # computing in 6.1 against worker:1's 3.9 ms under the suite's load, named 1.5 s before
    # worker:1 was); once worker:1 is named, the others wait for it, and worker:0 must not be.
    biting = named[0] if named else started
    assert not _named(lines, "worker:0", biting, stopped), scores
