"""Two real MultiWorkerMirrored workers: SIGTERM without a backup, chief-only TensorBoard, a
non-shared backup_dir, and two tasks racing for one health-board key."""

import json
import os
import sys

import pytest

from tests.helpers import PRELOAD, REPO, run_tfdist

JOB = os.path.join(REPO, "tests", "jobs", "workers_job.py")
pytestmark = [pytest.mark.multiprocess, pytest.mark.fault]


def _launch(mode, out):
    return run_tfdist(
        "launch", "--workers=2", PRELOAD, "--", sys.executable, JOB, mode, str(out), timeout=400
    )


@pytest.fixture(scope="module")
def sigterm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sigterm")
    return out, _launch("sigterm", out)


def test_sigterm_without_backup_stops_every_worker_at_the_same_step(sigterm_run):
    out, proc = sigterm_run
    assert "worker-1 receives SIGTERM after batch 9" in proc.stdout, proc.stdout[-3000:]
    assert proc.returncode == 143, proc.stdout[-3000:]
    assert "finished" not in proc.stdout  # nobody trained on to the end
    for task in ("worker-0", "worker-1"):
        assert f"[{task.replace('-', ':')}]" in proc.stdout
        # The vote happens after each update: batch 9 is the last one trained, on both workers.
        batches = (out / f"{task}.batches").read_text().split()
        assert batches == [f"{e}:{b}" for e in range(2) for b in range(6)][:10], (task, batches)
    stopped = [
        line
        for line in proc.stdout.splitlines()
        if "Stopped at epoch 2, micro-batch 4 (10 updates)" in line
    ]
    assert {line.split("]")[0] for line in stopped} == {"[worker:0", "[worker:1"}, proc.stdout[
        -3000:
    ]


def test_two_workers_racing_for_one_health_board_key_have_exactly_one_winner(sigterm_run):
    # The watchdog's alarm key: two tasks finding a hang in the same second once crashed the
    # loser's health thread (the store refuses a second insert), and its stacks were lost.
    out, _ = sigterm_run
    claims = {i: json.loads((out / f"worker-{i}.claim").read_text()) for i in range(2)}
    winners = [i for i, claim in claims.items() if claim is None]
    assert len(winners) == 1, claims
    assert claims[1 - winners[0]] == {"by": f"worker-{winners[0]}"}


def test_tensorboard_events_come_from_the_chief_only(sigterm_run):
    out, _ = sigterm_run
    chief_pid = (out / "worker-0.pid").read_text().strip()
    events = [
        name
        for _, _, files in os.walk(out / "logs")
        for name in files
        if name.startswith("events.out")
    ]
    assert events, "the chief wrote no TensorBoard events"
    # Event file names end in .<hostname>.<pid>.<n>.v2; worker-1 wrote into a temporary directory.
    assert all(name.split(".")[-3] == chief_pid for name in events), (chief_pid, events)


def test_backup_dir_not_shared_between_workers_is_a_clear_error(tmp_path):
    proc = _launch("not_shared", tmp_path)
    assert proc.returncode != 0
    for task in ("worker-0", "worker-1"):
        line = next((ln for ln in proc.stdout.splitlines() if f"{task} error:" in ln), "")
        assert "Invalid value for argument `backup_dir`" in line, proc.stdout[-3000:]
        assert "shared" in line
    assert "worker:1 does not see the file the chief has just written there" in proc.stdout
