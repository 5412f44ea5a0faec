"""``tfdist train --pipeline=...``: the flag, its refusals, a real run, and a kill with a bitwise
resume (issue 35).

The flag's parsing and refusals run in this process (the CLI's own ``main``, one line on
stderr, exit 2). Three short ``tfdist train`` processes train the default cnn in three stages
(``split_at=conv_1+dense``) on this host's CPU: one uninterrupted, one SIGKILLed in a backup,
one resuming from that backup.
"""

from __future__ import annotations

import json
import re
import signal

import pytest

from tests.helpers import run_cli_in_process, run_tfdist, train_config_of

PIPELINE = "--pipeline=split_at=conv_1+dense,micro_batches=4"
#: 2 epochs of 8 updates, a backup every 2 updates (backups 1-4 in epoch 1, 5-8 in epoch 2).
RUN = ("train", PIPELINE, "--epochs=2", "--steps_per_epoch=8", "--global_batch_size=32")
RUN += ("--backup_freq=2",)


def test_the_flag_becomes_pipeline_options_under_the_default_strategy():
    from tfdist.launch.pipeline_flag import pipeline_options

    config = train_config_of(
        "--pipeline=split_at=conv_0+dense,micro_batches=8,allow_batch_norm=true"
    )
    assert (config.strategy, config.sharding) == (None, None)  # TF's default strategy
    assert pipeline_options(config) == {
        "split_at": ["conv_0", "dense"],
        "micro_batches": 8,
        "allow_batch_norm": True,
    }
    config = train_config_of("--pipeline=split_at=dense_0,devices=/cpu:1+/cpu:0", "--model=mlp")
    assert pipeline_options(config) == {
        "split_at": ["dense_0"],
        "micro_batches": 1,
        "devices": ["/cpu:1", "/cpu:0"],
    }
    config = train_config_of("--pipeline=split_at=auto,stages=3,micro_batches=2,schedule=1f1b")
    assert pipeline_options(config) == {
        "split_at": "auto",
        "stages": 3,
        "micro_batches": 2,
        "schedule": "1f1b",
    }
    for off in ((), ("--pipeline=off",)):  # the default: no pipeline, the mirrored default
        config = train_config_of(*off)
        assert pipeline_options(config) is None and config.strategy == "mirrored"


@pytest.mark.parametrize(
    "flags,message",
    [
        (
            [PIPELINE, "--strategy=mirrored"],
            "`strategy`. Received: strategy='mirrored'. Expected no --strategy with --pipeline "
            "(only --strategy=multi_worker, the hybrid).",
        ),
        ([PIPELINE, "--num_devices=3"], "`num_devices`. Received: num_devices=3. Expected no "),
        (
            [PIPELINE, "--strategy=multi_worker", "--num_ps=1"],
            "`num_ps`. Received: num_ps=1. Expected no --num_ps with --pipeline.",
        ),
        (
            [PIPELINE, "--sharding=optimizer"],
            "`sharding`. Received: sharding='optimizer'. Expected None with pipeline in one "
            "process (one replica: nothing to shard over).",
        ),
        (
            ["--pipeline=split_at=conv_1,micro=4"],
            "`pipeline`. Received: pipeline='split_at=conv_1,micro=4'. Expected 'off' or "
            "key=value pairs of: split_at, micro_batches, devices, allow_batch_norm, stages, "
            "schedule.",
        ),
        (["--pipeline=on"], "`pipeline`. Received: pipeline='on'. Expected 'off' or key=value"),
        (["--pipeline=micro_batches=4"], "Expected split_at=NAME or split_at=NAME+NAME+..."),
        (["--pipeline=split_at=auto"], "Expected stages=K (at least 2) with split_at=auto."),
        (["--pipeline=split_at=a,schedule=1b1f"], "Expected schedule=gpipe or schedule=1f1b."),
        (["--pipeline=split_at=a,stages=2"], "(or split_at=auto with stages=K)"),
        (["--pipeline=split_at=a+a"], "Expected split_at=NAME or split_at=NAME+NAME+..."),
        (["--pipeline=split_at=a,micro_batches=x"], "Expected micro_batches= to be an integer."),
        (["--pipeline=split_at=a,micro_batches=0"], "Expected micro_batches= to be a positive"),
        (
            ["--pipeline=split_at=a+b,devices=/cpu:0+/cpu:1"],
            "Expected devices= one device per stage joined by '+' (3 for 2 split(s))",
        ),
        (
            ["--pipeline=split_at=a,micro_batches=5"],
            "`global_batch_size`. Received: global_batch_size=64. Expected a multiple of the "
            "pipeline's micro_batches=5.",
        ),
        ([PIPELINE, "--engine=ray"], "`pipeline`. Received: pipeline='split_at=conv_1+dense,"),
    ],
)
def test_refusals_are_one_line_naming_the_flag(flags, message, capsys):
    code, err = run_cli_in_process(["train", *flags], capsys)
    assert code == 2, err
    assert err.startswith("tfdist train: error: Invalid value for argument "), err
    assert message in err and err.count("\n") == 1, err


def test_a_pipeline_in_a_cluster_is_refused(monkeypatch, capsys):
    cluster = {"worker": ["localhost:1", "localhost:2"]}
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
    )
    code, err = run_cli_in_process(["train", PIPELINE], capsys)
    assert code == 2 and "Expected off in a task of a cluster (TF_CONFIG or Slurm" in err, err
    assert "unless with --strategy=multi_worker" in err


def test_the_hybrid_is_multi_worker_with_a_pipeline(monkeypatch):
    """``--strategy=multi_worker`` (and its ``--communication``, ``--sharding``) go with
    ``--pipeline``, in a cluster too; the real run is in tests/strategies/test_multi_worker.py."""
    from tfdist.cli.train_command import check_pipeline

    flags = (PIPELINE, "--strategy=multi_worker", "--communication=ring", "--sharding=gradients")
    config = train_config_of(*flags)
    assert (config.strategy, config.communication, config.sharding) == (
        "multi_worker",
        "ring",
        "gradients",
    )
    cluster = {"worker": ["localhost:1", "localhost:2"]}
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
    )
    check_pipeline(config)  # no refusal


def test_a_layer_the_model_lacks_is_one_line(capsys):
    """The Trainer names the model's layers (the model is made, nothing trains)."""
    code, err = run_cli_in_process(
        ["train", "--pipeline=split_at=conv_9", "--epochs=1", "--verbose=0"], capsys
    )
    assert code == 2, err
    assert err == (
        "tfdist train: error: Invalid value for argument `split_at`. Received: "
        "split_at=['conv_9']. Expected names of layers of 'cnn': inputs, conv_0, conv_1, pool, "
        "flatten, dense, dropout, logits. 'conv_9' is not one of them.\n"
    )


def _final(proc) -> tuple[int, str]:
    updates, digest = re.search(r"final updates=(\d+) weights_digest=(\w+)", proc.stdout).groups()
    return int(updates), digest


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The real ``tfdist train --pipeline=... --backup_dir`` run, uninterrupted."""
    backup = tmp_path_factory.mktemp("uninterrupted") / "backup"
    proc = run_tfdist(*RUN, f"--backup_dir={backup}", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return proc


@pytest.mark.slow
def test_train_runs_the_stages_on_logical_cpu_devices(uninterrupted):
    out = uninterrupted.stdout
    assert "Split the CPU into 3 logical devices, one per pipeline stage" in out
    stages = re.search(r"Pipeline of 3 stages: (.*)", out).group(1)
    assert "conv_0..conv_1 on /device:CPU:0" in stages
    assert "pool..dense on /device:CPU:1" in stages and "on /device:CPU:2" in stages
    assert "replicas=1" in out and "Epoch 2/2" in out
    assert _final(uninterrupted)[0] == 16


@pytest.mark.slow
@pytest.mark.fault
def test_a_killed_pipeline_run_resumes_bitwise(tmp_path, uninterrupted):
    """SIGKILL mid-epoch, then a restart from the backup: the uninterrupted run's weights, bit
    for bit.

    Backup 3 (after update 6 of epoch 1's 8) is SIGKILLed between its checkpoint write and its
    commit, so the last committed backup is backup 2, at update 4. The kill is seen at once
    (the process is gone: exit -9). A restart resumes at the last committed backup, so it
    trains again at most ``backup_freq`` = 2 updates, plus any trained while the next backup
    was still being written in the background (here exactly updates 5 and 6), mid-epoch, on
    the same batches: the final weights digest equals the uninterrupted run's.
    """
    backup = tmp_path / "backup"
    hook = {"TFDIST_BACKUP_TEST_HOOK": "kill_before_commit:3"}
    killed = run_tfdist(*RUN, f"--backup_dir={backup}", env=hook, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-3000:]
    state = json.loads((backup / "state.json").read_text())
    assert (state["checkpoint"], state["updates"], state["epoch"], state["step"]) == (
        "ckpt-2",
        4,
        0,
        4,
    )
    resumed = run_tfdist(*RUN, f"--backup_dir={backup}", timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "resuming at epoch 1, micro-batch 4 (4 updates done)" in resumed.stdout
    assert _final(resumed) == _final(uninterrupted)  # 16 updates, the same digest
    assert not backup.exists()  # removed after success
