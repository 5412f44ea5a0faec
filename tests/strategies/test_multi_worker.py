"""MultiWorkerMirroredStrategy with two real worker processes started by `tfdist launch`."""

import json
import os
import re
import socket
import sys

import keras
import numpy as np
import pytest

import tfdist
from tests.helpers import PRELOAD, REPO, run_tfdist
from tests.jobs.common import (
    NESTED_MODES,
    builder,
    dataset,
    initial_weights,
    nested_builder,
    nested_initial_weights,
    token_dataset,
)

JOB = os.path.join(REPO, "tests", "jobs", "mwms_job.py")
pytestmark = pytest.mark.multiprocess


def _launch_job(mode, out_dir, env=None):
    return run_tfdist(
        "launch", "--workers=2", PRELOAD, "--", sys.executable, JOB, mode, str(out_dir), env=env
    )


def _weights(path):
    with np.load(path) as f:
        return [f[f"arr_{i}"] for i in range(len(f.files))]


def _one_replica(build, data):
    trainer = tfdist.Trainer(
        build,
        strategy=tfdist.make_strategy("one_device"),
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    trainer.fit(data, epochs=2, verbose=0)
    return trainer.model.get_weights()


@pytest.fixture(scope="module")
def reference_weights():
    return _one_replica(builder(initial_weights()), dataset())


@pytest.fixture(scope="module")
def nested_reference_weights():
    """NESTED_MODES' reference: their model (a functional model inside a functional one) on
    one replica."""
    return _one_replica(nested_builder(nested_initial_weights()), token_dataset())


MODES = ["trainer", "trainer_accum", "trainer_bucketed", "trainer_zero1", "trainer_zero2_accum"]
MODES += ["trainer_zero3_accum"]
MODES += ["trainer_pipeline", "trainer_pipeline_zero2_accum", "keras_fit"]
MODES += ["trainer_balanced", "trainer_balanced_zero2_accum", "trainer_balanced_bf16"]
#: The splits tests/jobs/mwms_job.py forces in each balanced mode, in order.
BALANCED = {
    "trainer_balanced": [(4, 12), (12, 4), (1, 15), (8, 8)],
    "trainer_balanced_zero2_accum": [(2, 6), (7, 1), (4, 4)],
    "trainer_balanced_bf16": [(3, 13), (13, 3)],
}


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One 2-worker launch runs every mode in turn (one cluster start-up instead of four)."""
    out_dir = tmp_path_factory.mktemp("mwms")
    extra = ["balanced_resume", "adam_sharded", "hybrid_transformer_adam", "local_sgd"]
    return _launch_job(",".join(MODES + extra), out_dir), out_dir


@pytest.mark.parametrize("mode", MODES)
def test_two_workers_train_identically(mode, launched, reference_weights, request):
    """Each mode ends where one replica with the whole global batch ends.

    trainer_accum makes each update from 2 micro-batches of half the batch;
    trainer_bucketed all-reduces the gradients in 2 buckets; trainer_zero1 and
    trainer_zero2_accum shard the optimizer state (and the gradients, reduced each
    micro-batch) over the two workers; trainer_zero3_accum the weights too (ZeRO-3, 2
    accumulated micro-batches; its biases kept whole and mirrored, ``keep_whole_below``), on a
    nested model (NESTED_MODES: an Embedding and a Dense over the 3-D sequence in a functional
    model inside the trained one, as a KerasHub backbone sits in its task; its own one-replica
    reference); trainer_pipeline is the hybrid: 2 workers x 2
    pipeline stages (each worker's CPU:0 and CPU:1), 2 micro-batches, to 1e-6 of one replica, and
    trainer_pipeline_zero2_accum the same with its gradients and optimizer state sharded over
    the workers and 2 accumulated batches per update. trainer_balanced and
    trainer_balanced_zero2_accum split each global batch unevenly (balance=), the split changed
    mid-epoch 3 and 2 times (each a "Balance:" line of the chief's); trainer_balanced_bf16 with
    its gradients all-reduced in bf16 (to 2e-3, the compressed exchange's bound).
    """
    proc, out_dir = launched
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"[worker:0] {mode} done 2" in proc.stdout and f"[worker:1] {mode} done 2" in proc.stdout
    if mode.startswith("trainer"):
        # 6 updates per epoch, 2 epochs.
        assert f"[worker:0] {mode} iterations 12" in proc.stdout
        # One collective per update; bucketed: one per bucket (CollectiveReduceV2 ops in the graph).
        # trainer_zero2_accum: each of the 4 weights' gradient reduce-scattered in its layer's
        # backward (ZeRO-2 layer by layer) and the examples counted, in the micro-batch loop's
        # body (run k times); trainer_balanced_zero2_accum: the 2 micro-batches unrolled, 5 each.
        collectives = 2 if mode == "trainer_bucketed" else 1
        collectives = {"trainer_zero2_accum": 5, "trainer_balanced_zero2_accum": 10}.get(
            mode, collectives
        )
        # trainer_zero3_accum: the embedding's sparse gradient unrolls the 2 micro-batches (its
        # rows all-gathered, no all-reduce); in each, the 2 cut kernels' gradients
        # reduce-scattered in the backward; then the 2 biases kept whole (keep_whole_below=9)
        # all-reduced with the examples counted, one bucket (the weights' gathers all-reduce
        # integer bits: not counted).
        collectives = 5 if mode == "trainer_zero3_accum" else collectives
        assert f"[worker:0] {mode} gradient_all_reduces_per_update {collectives}" in proc.stdout
    if mode == "trainer_zero3_accum":  # the biases kept whole, the embedding and kernels cut
        for task in (0, 1):
            assert f"[worker:{task}] {mode} kept [2, 4] cut [0, 1, 3]" in proc.stdout
    if "balanced" in mode:
        for a, b in BALANCED[mode]:  # each split once, by the chief
            split = f"Balance: worker:0 takes {a}, worker:1 takes {b} of every global batch"
            said = [line for line in proc.stdout.splitlines() if split in line]
            assert len(said) == 1 and said[0].startswith("[worker:0]"), (split, said)
    w0, w1 = (_weights(out_dir / f"{mode}-worker-{i}.npz") for i in (0, 1))
    if mode in NESTED_MODES:
        reference_weights = request.getfixturevalue("nested_reference_weights")
    for a, b, ref in zip(w0, w1, reference_weights, strict=True):
        np.testing.assert_array_equal(a, b)  # both workers hold the same model
        # 2 workers x b == 1 replica x 2b
        # bf16: the gradients travel in 16 bits (tests/training/step/test_exchange.py's bound).
        atol = 2e-3 if mode.endswith("_bf16") else 1e-6 if "pipeline" in mode else 1e-5
        np.testing.assert_allclose(a, ref, atol=atol, rtol=0)
    history = json.loads((out_dir / f"{mode}-worker-0.json").read_text())
    expected = {"loss", "accuracy"} | ({"updates"} if mode.endswith("_accum") else set())
    assert set(history) == expected and len(history["loss"]) == 2


def test_a_balanced_run_resumes_its_splits_from_the_backup(launched, reference_weights):
    """Forced splits, a crash after update 7 (backups every 2), a new Trainer resumes from
    update 6 with the split due there (11 of 16 on worker:0), then the next: one device's
    weights to 1e-5."""
    proc, out_dir = launched
    assert "[worker:0] balanced_resume crashed at 7" in proc.stdout, proc.stdout[-3000:]
    assert "[worker:1] balanced_resume done 2" in proc.stdout
    said = proc.stdout.split("Resumed from update 6", 1)[1].split("balanced_resume done")[0]
    splits = re.findall(r"\[worker:0\].*Balance: worker:0 takes (\d+), worker:1 takes (\d+)", said)
    assert splits == [("11", "5"), ("2", "14")], said
    for worker in (0, 1):
        weights = _weights(out_dir / f"balanced_resume-worker-{worker}.npz")
        for a, ref in zip(weights, reference_weights):
            np.testing.assert_allclose(a, ref, atol=1e-5, rtol=0)


def test_two_workers_train_adam_sharded_as_unsharded(launched):
    """Adam with its state and gradients sharded over two workers ends as unsharded (1e-7)."""
    proc, out_dir = launched
    lines = [line for line in proc.stdout.splitlines() if "adam_sharded max_gap" in line]
    assert len(lines) == 2, proc.stdout[-3000:]  # one per worker
    assert all(float(line.split()[-1]) <= 1e-7 for line in lines), lines
    held = json.loads(
        proc.stdout.split("[worker:0] adam_sharded replica_bytes ")[1].splitlines()[0]
    )
    assert held["optimizer_state"] < 0.6 * held["unsharded"]["optimizer_state"], held


def test_local_sgd_on_two_workers(launched):
    """Local SGD with sync_every=1 ends where synchronous training on the same two workers ends
    (to 1e-6, SGD); DiLoCo (Adam inside, Nesterov SGD(0.7, 0.9) outside, sync_every=5): both
    workers hold the same bits after each sync (updates 5, 10) and their own between, and after
    fit, whose end syncs the partial round (updates 11-12); no gradient all-reduce in an update,
    one all-reduce in a sync (tests/jobs/mwms_job.py)."""
    proc, out_dir = launched
    assert "[worker:1] local_sgd done 2" in proc.stdout, proc.stdout[-3000:]
    synchronous = _weights(out_dir / "trainer-worker-0.npz")
    for worker in (0, 1):
        local = _weights(out_dir / f"local_sgd_h1-worker-{worker}.npz")
        for a, b in zip(local, synchronous):
            np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    digests = {
        (task, int(update)): digest
        for task, update, digest in re.findall(
            r"\[worker:(\d)\] local_sgd digest (\d+) (\w+)", proc.stdout
        )
    }
    assert len(digests) == 24, digests
    for update in range(1, 13):
        same = digests[("0", update)] == digests[("1", update)]
        assert same == (update % 5 == 0), update
    final = re.findall(r"\[worker:(\d)\] local_sgd final digest (\w+)", proc.stdout)
    assert len(final) == 2 and final[0][1] == final[1][1], final
    assert final[0][1] not in (digests[("0", 12)], digests[("1", 12)])
    for task in (0, 1):
        assert f"[worker:{task}] local_sgd syncs [1.0, 2.0]" in proc.stdout
        assert f"[worker:{task}] local_sgd gradient_all_reduces_per_update 0" in proc.stdout
        assert f"[worker:{task}] local_sgd all_reduces_per_sync 1" in proc.stdout


def test_local_sgd_adapts_to_a_slow_worker(launched):
    """adapt_to_stragglers, sync_every=4, 12 updates, worker:1 sleeping 100 ms a forward pass
    (tests/jobs/mwms_job.py), on a causal transformer LM with Adam (an Embedding's sparse rows,
    a skipped update's none; a masked loss): worker:0 takes every update, worker:1 fewer in the
    third round (the first round's times are dropped; its weights unchanged across a skipped
    update), both agree on the next round's steps, and both hold the same bits after each sync
    (updates 4, 8, 12) and differ between."""
    proc, _ = launched
    assert "[worker:1] local_sgd done 2" in proc.stdout, proc.stdout[-3000:]
    found = re.findall(r"\[worker:(\d)\] local_sgd adapt digest (\d+) (\w+)", proc.stdout)
    digests = {(task, int(update)): digest for task, update, digest in found}
    assert len(digests) == 24, digests
    for update in range(1, 13):
        same = digests[("0", update)] == digests[("1", update)]
        assert same == (update % 4 == 0), update
    for update in range(2, 13):  # worker:0 takes every update; worker:1 skips some
        assert digests[("0", update)] != digests[("0", update - 1)], update
    skipped = [u for u in range(5, 13) if digests[("1", u)] == digests[("1", u - 1)]]
    assert skipped, digests
    steps = re.findall(r"\[worker:(\d)\] local_sgd adapt local_steps \[(.*)\]", proc.stdout)
    taken = {task: float(counts.split(",")[-1]) for task, counts in steps}
    assert taken["0"] == 12.0 and taken["1"] == 12.0 - len(skipped), taken
    agreed = re.findall(r"\[worker:\d\] local_sgd adapt steps (\[.*\])", proc.stdout)
    assert len(agreed) == 2 and agreed[0] == agreed[1], agreed
    fast, slow = json.loads(agreed[0])
    assert fast == 4 and 1 <= slow < 4, agreed


def test_hybrid_trains_a_transformer_with_adam_as_keras_on_one_device(launched):
    """The hybrid (2 workers x 2 stages) on a causal transformer LM, cut after its attention,
    Adam: the embedding's rows gathered from both workers, the residual stream crossing the
    cut: Keras's weights on one device to 1e-5, the same on both workers."""
    from tests.keras_parity.rows_transformers import lm_model, text

    proc, out_dir = launched
    assert "[worker:1] hybrid_transformer_adam done 2" in proc.stdout, proc.stdout[-3000:]
    reference = lm_model()
    reference.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    ids = text()
    reference.fit(ids[:, :-1], ids[:, 1:], batch_size=16, epochs=2, shuffle=False, verbose=0)
    w0, w1 = (_weights(out_dir / f"hybrid_transformer_adam-worker-{i}.npz") for i in (0, 1))
    for a, b, ref in zip(w0, w1, reference.get_weights()):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, ref, atol=1e-5, rtol=0)


def test_hybrid_keeps_each_stage_on_its_workers_own_device(launched):
    """The hybrid's stage k lives on each worker's CPU:k; its evaluate runs through the stages
    and gives both workers the same numbers."""
    proc, _ = launched
    for task in (0, 1):
        line = proc.stdout.split(f"[worker:{task}] trainer_pipeline stage_devices ")[1]
        stages = json.loads(line.splitlines()[0])
        assert [{d.split("/", 3)[-1] for d in stage} for stage in stages] == [
            {f"task:{task}/device:CPU:0"},
            {f"task:{task}/device:CPU:1"},
        ], stages
    evaluations = [
        proc.stdout.split(f"[worker:{task}] trainer_pipeline evaluate ")[1].splitlines()[0]
        for task in (0, 1)
    ]
    assert evaluations[0] == evaluations[1]
    # Sharded: each master shard (and its slots) on its stage's device, not the replica's.
    line = proc.stdout.split("[worker:1] trainer_pipeline_zero2_accum master_devices ")[1]
    masters = json.loads(line.splitlines()[0])
    assert [m.rsplit("/", 1)[-1] for m in masters] == ["device:CPU:0"] * 2 + ["device:CPU:1"] * 2


@pytest.mark.parametrize(
    "shim,symptom",
    [("symbolic_build", "PerReplica"), ("multi_worker_reduce", "Invalid reduction dimension 0")],
)
def test_upstream_keras_still_needs_the_shim(shim, symptom, tmp_path):
    """Fails when Keras fixes plain multi-worker fit: then gate the shim off for that version."""
    proc = _launch_job("keras_fit", tmp_path, env={"TFDIST_DISABLE_COMPAT": shim})
    assert proc.returncode != 0, f"keras {keras.__version__} no longer needs the {shim} shim"
    assert symptom in proc.stdout


def test_cli_train_under_launch():
    """``tfdist train --strategy=multi_worker`` under ``tfdist launch``, as the hybrid: each of
    the 2 workers runs the default cnn as 3 pipeline stages on its own logical CPU devices."""
    proc = run_tfdist(
        "launch",
        "--workers=2",
        "--",
        sys.executable,
        "-m",
        "tfdist",
        "train",
        "--strategy=multi_worker",
        "--pipeline=split_at=conv_1+dense,micro_batches=2",
        "--epochs=4",
        "--global_batch_size=64",
        "--verbose=0",
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = [line for line in proc.stdout.splitlines() if "final val_accuracy=" in line]
    assert len(lines) == 1 and lines[0].startswith("[worker:0]")  # only the chief reports
    accuracy = float(lines[0].split("val_accuracy=")[1].split()[0])
    assert accuracy >= 0.9
    assert "replicas=2" in lines[0]
    stages = [line for line in proc.stdout.splitlines() if "Pipeline of 3 stages" in line]
    assert any("task:0/device:CPU:2" in line for line in stages), stages


def test_port_in_use_is_a_clear_error(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        other = port + 1 if port < 65000 else port - 1
        monkeypatch.setenv(
            "TF_CONFIG",
            json.dumps(
                {
                    "cluster": {"worker": [f"127.0.0.1:{port}", f"127.0.0.1:{other}"]},
                    "task": {"type": "worker", "index": 0},
                }
            ),
        )
        with pytest.raises(ValueError, match=r"TF_CONFIG.cluster.worker\[0\].*in use"):
            tfdist.make_strategy("multi_worker")
