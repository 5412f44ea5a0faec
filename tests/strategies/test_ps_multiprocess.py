"""A real multi-process parameter-server cluster under `tfdist launch`; workers and a ps killed."""

import json
import os
import sys

import pytest

from tests.helpers import PRELOAD, REPO, run_tfdist

JOB = os.path.join(REPO, "tests", "jobs", "ps_job.py")
pytestmark = [pytest.mark.multiprocess, pytest.mark.fault]


def _launch(out_dir, kills, *flags, job_args=()):
    return run_tfdist(
        "launch",
        "--chief",
        "--workers=2",
        "--ps=1",
        PRELOAD,
        *flags,
        "--",
        sys.executable,
        JOB,
        str(out_dir),
        kills,
        *job_args,
        timeout=400,
    )


def _starts(out_dir, task):
    return (out_dir / f"{task}.starts").read_text().split()


@pytest.mark.parametrize("restarts", [0, 1])
def test_training_survives_a_killed_worker(tmp_path, restarts):
    # worker-1 is SIGKILLed after batch 20. Without restarts the coordinator
    # reschedules its steps on worker-0; with one, the launcher restarts it
    # and the coordinator takes it back into the job.
    proc = _launch(
        tmp_path,
        "20:worker-1",
        f"--max_restarts={restarts}",
        job_args=["wait_rejoin"] if restarts else [],
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "killing worker-1" in proc.stdout
    tail = proc.stdout[-4000:]
    assert len(_starts(tmp_path, "worker-1")) == 1 + restarts, tail
    if restarts:
        assert "restarting worker:1 alone (restart 1 of 1)" in proc.stdout, tail
        assert "Worker /job:worker/replica:0/task:1 has been recovered" in proc.stdout, tail
    result = json.loads((tmp_path / "result.json").read_text())
    # 4 epochs x 30 steps. A step cut off by the worker's death after its
    # update reached the ps runs again (at-least-once), so the kill may add one.
    assert 120 <= result["iterations"] <= 122, result
    assert result["val_accuracy"] >= 0.9, result


def test_a_lost_parameter_server_stops_the_run_with_a_clear_error(tmp_path):
    proc = _launch(tmp_path, "20:ps-0")
    assert proc.returncode != 0
    assert "ParameterServerFailure: Parameter server ps:0 failed" in proc.stdout
    assert "Job failed" in proc.stdout and "ps:0 killed by signal SIGKILL" in proc.stdout
    assert not (tmp_path / "result.json").exists()


def test_cli_train_on_a_launched_ps_cluster():
    proc = run_tfdist(
        "launch",
        "--chief",
        "--workers=2",
        "--ps=1",
        PRELOAD,
        "--",
        sys.executable,
        "-m",
        "tfdist",
        "train",
        "--strategy=parameter_server",
        "--epochs=3",
        "--steps_per_epoch=25",
        "--verbose=0",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    line = [x for x in proc.stdout.splitlines() if "final val_accuracy=" in x]
    assert len(line) == 1 and line[0].startswith("[chief:0]")
    assert float(line[0].split("val_accuracy=")[1].split()[0]) >= 0.9
