"""The tfdist command line: the default run and its errors."""
import pytest

from tests.helpers import run_tfdist


@pytest.mark.slow
def test_default_train_run():
    proc = run_tfdist("train")
    assert proc.returncode == 0, proc.stdout[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("final val_accuracy=")][0]
    assert float(line.split("=")[1].split()[0]) >= 0.95
    assert "replicas=2" in line
    assert "Epoch 8/8" in proc.stdout


def test_train_saves_the_model(tmp_path):
    proc = run_tfdist("train", "--epochs=1", "--model=mlp", "--strategy=one_device", f"--model_dir={tmp_path}",
                      "--verbose=0")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (tmp_path / "model.keras").exists()


@pytest.mark.parametrize("args,pattern", [
    (["train", "--strategy=mirored"], "flag --strategy=mirored: value should be one of"),
    (["train", "--precision=fp8"], "flag --precision=fp8: value should be one of"),
    (["train", "--global_batch_size=63"], "argument `global_batch_size`. Received: global_batch_size=63"),
    (["train", "--model=vgg"], "argument `model`. Received: model='vgg'"),
    (["train", "--dataset=imagenet"], "argument `dataset`. Received: dataset='imagenet'"),
    (["train", "--epochs=0"], "argument `epochs`. Received: epochs=0"),
    (["fly"], "argument `command`. Received: command='fly'. Expected one of: train, launch, bench"),
    (["launch", "--workers=2"], "launch needs a command after --"),
    (["launch", "--host=10.1.2.3", "--", "true"], "argument `host`. Received: host='10.1.2.3'.*--allow_external"),
])
def test_cli_errors(args, pattern):
    import re

    proc = run_tfdist(*args, timeout=120)
    assert proc.returncode != 0
    assert re.search(pattern, proc.stdout), proc.stdout[-2000:]
    assert "Traceback" not in proc.stdout


def test_manifest_slurm_writes_the_script(tmp_path):
    out = tmp_path / "job.sbatch"
    proc = run_tfdist("manifest", "slurm", "--nnodes=2", "--workers=4", "--partition=gpu", "--time=01:00:00",
                      f"--output={out}", "--", "tfdist", "train", "--strategy=multi_worker", timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert f"submit it with: sbatch {out}" in proc.stdout
    lines = out.read_text().splitlines()
    assert [line for line in lines if line.startswith("#SBATCH")] == [
        "#SBATCH --job-name=tfdist", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --partition=gpu",
        "#SBATCH --time=01:00:00"]
    assert "srun --nodes=2 --ntasks-per-node=4 --kill-on-bad-exit=1 tfdist train --strategy=multi_worker" in lines
    assert lines[-1] == 'exit "$rc"'


def test_launch_per_node_refuses_external_hosts():
    proc = run_tfdist("launch", "--nnodes=2", "--node_rank=1", "--hosts=10.1.2.3:2222,10.1.2.4:2222", "--", "true",
                      timeout=120)
    assert proc.returncode == 2
    assert ("tfdist launch: error: Invalid value for argument `hosts`. "
            "Received: hosts=['10.1.2.3:2222', '10.1.2.4:2222']") in proc.stdout
    assert "--allow_external" in proc.stdout and "unauthenticated" in proc.stdout
    assert "Traceback" not in proc.stdout
