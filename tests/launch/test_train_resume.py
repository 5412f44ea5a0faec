"""`tfdist train --backup_dir --backup_freq`: a preempted CLI run resumes at the exact update.

A real `python -m tfdist train` process gets SIGTERM mid-training, saves its
backup and exits 75; a second run of the same command restores it and ends
with the update count and the weights digest of an uninterrupted run (that one
runs in the test's own process: no third launch). The run is local SGD with
DiLoCo (two mirrored replicas, H=4, Adam inside, Nesterov outside). A call
ends where a backup is due, so the SIGTERM's save falls at a multiple of
``--backup_freq=5``: mid-round (10, 15) unless it waits for the 4th backup
(update 20), and the backup must hold each replica's own parameters and Adam
slots and the outer optimizer's state.
"""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO
from tfdist import cli

EPOCHS = 3
STEPS = 1437 // 64  # digits' training split in full batches of 64: updates per epoch.
ARGS = [
    "train",
    "--strategy=mirrored",
    "--num_devices=2",
    "--model=mlp",
    "--dataset=digits",
    f"--epochs={EPOCHS}",
    "--global_batch_size=64",
    "--backup_freq=5",  # not a multiple of H=4 (below)
    "--local_sgd=sync_every=4,outer=nesterov",
    "--optimizer=adam",
]


def _env():
    env = dict(
        os.environ,
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    env.pop("TF_CONFIG", None)
    return env


@pytest.mark.multiprocess
@pytest.mark.fault
def test_sigterm_then_restart_resumes_at_the_exact_update(tmp_path, capsys):
    backup_dir = tmp_path / "backup"
    command = [sys.executable, "-m", "tfdist", *ARGS, f"--backup_dir={backup_dir}"]
    with subprocess.Popen(
        command, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        deadline = time.monotonic() + 240
        while not (backup_dir / "state.json").exists():  # The first backup: training is under way.
            assert proc.poll() is None and time.monotonic() < deadline, "no backup appeared"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        first, _ = proc.communicate(timeout=120)
    assert proc.returncode == 75, first
    saved = re.search(r"Saved a backup at epoch (\d+), micro-batch (\d+) after SIGTERM", first)
    assert saved, first
    saved_update = (int(saved.group(1)) - 1) * STEPS + int(saved.group(2))
    assert 0 < saved_update < EPOCHS * STEPS

    second = subprocess.run(
        command,
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=240,
    )
    assert second.returncode == 0, second.stdout
    resumed = re.search(
        r"resuming at epoch (\d+), micro-batch (\d+) \((\d+) updates done\)", second.stdout
    )
    assert resumed, second.stdout
    assert resumed.groups() == (saved.group(1), saved.group(2), str(saved_update))
    assert f"{STEPS}/{STEPS} - " in second.stdout  # The epoch length this test assumes.
    final = re.search(r"final updates=(\d+) weights_digest=(\w+)", second.stdout)
    assert final, second.stdout
    assert final.group(1) == str(EPOCHS * STEPS)  # Same count as an uninterrupted run.
    assert final.group(2) == _uninterrupted_digest(capsys), (saved_update, second.stdout)
    assert (
        not backup_dir.exists() or not (backup_dir / "state.json").exists()
    )  # Removed after success.


def _uninterrupted_digest(capsys):
    """The weights digest of the same run without a kill, trained in this process."""
    cli.FLAGS.unparse_flags()
    capsys.readouterr()
    try:
        plain = [a for a in ARGS if not a.startswith("--backup_freq")]  # It needs --backup_dir.
        assert cli.main(cli.parse_flags(["tfdist", *plain])) in (0, None)
    finally:
        cli.FLAGS.unparse_flags()
    out = capsys.readouterr().out
    digest = re.search(r"final updates=\d+ weights_digest=(\w+)", out)
    assert digest, out
    return digest.group(1)


def test_backup_freq_needs_backup_dir(capsys):
    from tfdist.config import TrainConfig

    with pytest.raises(
        ValueError,
        match=r"`backup_freq`. Received: backup_freq=5. Expected None without backup_dir",
    ):
        TrainConfig(backup_freq=5)
    with pytest.raises(ValueError, match=r"`backup_freq`. Received: backup_freq=0"):
        TrainConfig(backup_dir="/tmp/x", backup_freq=0)
    assert cli.FLAGS["backup_dir"].help and cli.FLAGS["backup_freq"].help
