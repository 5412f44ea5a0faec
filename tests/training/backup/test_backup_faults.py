"""Fault tolerance with real kills: worker death, a kill in a save, SIGTERM, fewer workers."""

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import PRELOAD, REPO, launch_backup_job, launch_report, npz_weights, run_tfdist

JOB = os.path.join(REPO, "tests", "jobs", "backup_job.py")
pytestmark = [pytest.mark.multiprocess, pytest.mark.fault]


_weights = npz_weights


def _job(strategy, out, backup, *extra, env=None):
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO, **(env or {})}
    full_env.pop("TF_CONFIG", None)
    return subprocess.run(
        [sys.executable, JOB, strategy, str(out), str(backup), *extra],
        env=full_env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )


def _launch(out, backup, *extra, restarts=1):
    return launch_backup_job(out, backup, *extra, restarts=restarts, timeout=400)


@pytest.fixture(scope="module")
def uninterrupted_mwms(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    proc = _launch(out, out / "backup", restarts=0)
    assert proc.returncode == 0, launch_report(proc, 3000)
    return _weights(out / "worker-0.npz")


def test_worker_death_resumes_at_the_backed_up_update_bitwise(tmp_path, uninterrupted_mwms):
    # 16 steps per epoch, a backup every 2 updates. worker-1 dies after global
    # batch 21 (22 updates done). The chief still saves at 22 (saving needs no
    # collective), then blocks on the next all-reduce until the launcher
    # restarts the group; the work lost per kill is at most backup_freq updates.
    # The run shards its optimizer state (SGD's momentum, ZeRO-1): the backup holds each
    # slot whole, the restarted group gives each worker its block back, and the weights equal
    # the unsharded uninterrupted run's bitwise.
    proc = _launch(tmp_path, tmp_path / "backup", "--die_at=21", "--sharding=optimizer")
    assert proc.returncode == 0, launch_report(proc, 4000)
    assert "worker-1 dying after batch 21" in proc.stdout
    assert "restarting the whole group (restart 1 of 1)" in proc.stdout
    resumed = re.search(
        r"resuming at epoch 2, micro-batch (\d+) \((\d+) updates done\)", proc.stdout
    )
    assert resumed and int(resumed.group(2)) in (20, 22), proc.stdout[-3000:]
    assert int(resumed.group(1)) == int(resumed.group(2)) - 16
    for task in ("worker-0", "worker-1"):
        info = json.loads((tmp_path / f"{task}.json").read_text())
        assert info["attempt"] == 2 and info["iterations"] == 48
        for a, b in zip(_weights(tmp_path / f"{task}.npz"), uninterrupted_mwms):
            np.testing.assert_array_equal(a, b)  # bitwise equal to the uninterrupted run
    assert not (tmp_path / "backup").exists()  # removed after success


def test_a_two_worker_backup_resumes_on_one_worker(tmp_path, uninterrupted_mwms):
    # A lost machine: worker-1 dies after global batch 21 and nothing restarts the group. The
    # job comes back on one worker (1 replica instead of 2), same global batch of 32. The two
    # workers shard their optimizer state and gradients (ZeRO-2) and split each global batch
    # unevenly (balance=, forced splits: 10/22, then 22/10 from update 9); the one resumes
    # unsharded from the same backup (the slots are saved whole), with nothing to balance.
    backup = tmp_path / "backup"
    (tmp_path / "two").mkdir()
    (tmp_path / "one").mkdir()
    died = _launch(
        tmp_path / "two", backup, "--die_at=21", "--sharding=gradients", "--balance", restarts=0
    )
    assert died.returncode != 0 and "worker-1 dying after batch 21" in died.stdout
    assert "worker:0 takes 22, worker:1 takes 10 of every global batch of 32" in died.stdout
    assert json.loads((backup / "state.json").read_text())["replicas"] == 2
    proc = run_tfdist(
        "launch", "--workers=1", PRELOAD, "--", sys.executable, JOB, "multi_worker",
        str(tmp_path / "one"), str(backup), "--balance", timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, launch_report(proc, 3000)
    assert "balance: one worker, nothing to balance" in proc.stdout
    assert "written on 2 replicas and resumes on 1, at the same global step" in proc.stdout
    assert json.loads((tmp_path / "one" / "worker-0.json").read_text())["iterations"] == 48
    updates = int(re.search(r"\((\d+) updates done\)", proc.stdout).group(1))
    assert updates in (20, 22)
    counter, *weights = _weights(tmp_path / "one" / "worker-0.npz")
    # The model's replica-step counter counts 2 per update on 2 replicas, then 1.
    assert float(counter) == 2 * updates + (48 - updates)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(weights, uninterrupted_mwms[1:]))
    print(f"2 -> 1 workers: max abs weight difference {diff:.3g}")
    # The same global batches from the backed-up update on (tfdist.data splits each global batch
    # across the workers); only the all-reduce's float32 summation order differs.
    assert diff <= 1e-5


def test_sigterm_preemption_loses_and_repeats_nothing(tmp_path):
    """SIGTERM to worker-1 after global batch 21: both workers save at update 22 and exit 75,
    the group restarts from that backup and trains to 48 updates.

    The run trains with DiLoCo (``--local_sgd=4``: momentum SGD inside, Nesterov outside), so
    update 22 is mid-round: the two workers' parameters and momenta differ there (2 updates
    since the sync of update 20). The backup holds each worker's own (gathered to the chief
    with one all-gather, committed with the chief's checkpoint), each worker takes its own back,
    and both end bitwise equal to an uninterrupted run of the same job (trained afterwards in
    the same processes, ``--reference``, so no third launch). What it detects: a resume that
    gave worker-1 the chief's parameters or momenta (before per-replica backups) ends off the
    reference at the next sync's average; a lost or repeated update moves the counter.
    """
    proc = _launch(
        tmp_path, tmp_path / "backup", "--sigterm_at=21", "--local_sgd=4", "--reference",
        restarts=0,
    )  # fmt: skip
    assert proc.returncode == 0, launch_report(proc, 4000)
    assert "preempted after saving a backup; restarting the whole group" in proc.stdout
    assert "resuming at epoch 2, micro-batch 6 (22 updates done)" in proc.stdout
    for task in ("worker-0", "worker-1"):
        info = json.loads((tmp_path / f"{task}.json").read_text())
        assert info["attempt"] == 2
        assert info["iterations"] == 48
        # +1 per replica per step, saved with the model: exactly replicas x steps.
        assert info["counter"] == info["replicas"] * 48
        reference = _weights(tmp_path / f"{task}-reference.npz")
        for a, b in zip(_weights(tmp_path / f"{task}.npz"), reference):
            np.testing.assert_array_equal(a, b)  # bitwise: each worker resumed its own round


@pytest.fixture(scope="module")
def uninterrupted_one_device(tmp_path_factory):
    out = tmp_path_factory.mktemp("one-device-reference")
    reference = _job("one_device", out, out / "backup")
    assert reference.returncode == 0, reference.stdout[-3000:]
    return _weights(out / "worker-0.npz")


@pytest.mark.parametrize("mode", ["asynchronous", "synchronous"])
def test_kill_inside_a_save_leaves_the_previous_backup(tmp_path, mode, uninterrupted_one_device):
    # Save 3 (after update 6) is SIGKILLed once its checkpoint files are written, before its
    # commit: asynchronously in TF's writer thread while training goes on, synchronously in
    # the training thread.
    backup = tmp_path / "backup"
    flags = ["--sync_backup"] if mode == "synchronous" else []
    hook = {"TFDIST_BACKUP_TEST_HOOK": "kill_before_commit:3"}
    killed = _job("one_device", tmp_path, backup, *flags, env=hook)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-3000:]
    state = json.loads((backup / "state.json").read_text())
    # The interrupted save 3 never committed: state.json still names save 2.
    assert (state["checkpoint"], state["updates"]) == ("ckpt-2", 4)
    assert (backup / "ckpt-3.index").exists()  # its files were written, but nothing points at them

    resumed = _job("one_device", tmp_path, backup, *flags)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "(4 updates done)" in resumed.stdout
    for a, b in zip(_weights(tmp_path / "worker-0.npz"), uninterrupted_one_device):
        np.testing.assert_array_equal(a, b)  # bitwise equal to the uninterrupted run
