"""Ray Train as tfdist's engine, on a local Ray cluster started in a loopback-only namespace.

    .venv/bin/python -m pytest tests/ray -q

One driver process (tests/ray/driver.py) runs ``ray.init(num_cpus=12,
include_dashboard=False)`` once for the whole module, inside a private network
namespace that has only ``lo`` (``unshare -n``): Ray's ports, TF's gRPC ports
and every packet these tests send stay there. Ray writes the node's address
into TF_CONFIG; inside the namespace that address is 127.0.0.1, which the
tests check.

Each test checks the result of one scenario (see :data:`SCENARIOS`; three
tests read the one "main_group" scenario, whose worker group runs three jobs).
The fixture hands the driver the scenarios of every selected test at once, and
the driver runs them side by side on the one cluster; each test waits only for
its own result. Every worker group costs a Ray actor and a TensorFlow start-up
per worker, so the module starts four groups (and one restart), not six.
"""

import json
import os
import shutil
import subprocess
import sys
import threading

import pytest

from tests.helpers import REPO, run_tfdist

pytestmark = [pytest.mark.ray]
# Logical CPUs (Ray's scheduling units, not cores): more than every scenario's worker groups need
# at once (four groups of 2), so none queues. A queued group could take the CPUs the killed group
# frees, and the fault scenario's restart would wait for it to end.
NUM_CPUS = 12


def _have_ray():
    try:
        import ray  # noqa: F401

        return True
    except ImportError:
        return False


# Test -> the driver scenario whose result it checks (tests/ray/driver.py), in the order they are
# handed to the driver: the longest first. Three tests share "main_group" (the fault scenario and
# one worker group that runs its reference, the digits job and the Ray Data job): every worker
# group costs Ray and TensorFlow start-ups, about 35 CPU-seconds.
SCENARIOS = {
    "test_killed_worker_resumes_from_rays_checkpoint_bitwise": "main_group",
    "test_two_workers_train_digits_with_identical_weights": "main_group",
    "test_ray_data_shards_feed_the_trainer": "main_group",
    "test_rays_tensorflow_quickstart_flow_with_tfdist_imported": "quickstart",
    "test_cli_engine_ray": "cli",
    "test_more_workers_than_cpus_fails_before_waiting": "too_many_workers",
}
CLI_ARGS = ["--engine=ray", "--num_workers=2", "--model=mlp", "--epochs=2", "--verbose=0"]
RESULT = "RESULT "


class Driver:
    def __init__(self):
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO, "RAY_DEDUP_LOGS": "1"}
        env.pop("TF_CONFIG", None)
        env.pop("RAY_ADDRESS", None)
        self.proc = subprocess.Popen(
            [
                "unshare",
                "-n",
                "sh",
                "-c",
                f"ip link set lo up && exec {sys.executable} -m tests.ray.driver {NUM_CPUS}",
            ],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.log = []
        self.answers = {}
        self._read_until(lambda line: line.startswith("READY"), "READY", timeout=180)

    def _read_until(self, done, what, timeout):
        timer = threading.Timer(timeout, self.proc.kill)
        timer.start()
        try:
            for line in self.proc.stdout:
                self.log.append(line)
                # A Ray log line may lack its newline when ours follows it: look anywhere in it.
                at = line.find(RESULT + "{")
                if at >= 0:
                    answer = json.loads(line[at + len(RESULT) :])
                    self.answers[answer.pop("id")] = answer
                if done(line):
                    return
        finally:
            timer.cancel()
        raise AssertionError(f"the Ray driver stopped before {what}:\n" + "".join(self.log[-80:]))

    def submit(self, scenario, *args):
        """Starts ``scenario`` in the driver (it runs beside the others); returns its id."""
        request = {"id": scenario, "scenario": scenario, "args": list(args)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return scenario

    def result(self, key, timeout=600):
        """Waits for the scenario's answer (``timeout`` from now; others may finish first)."""
        if key not in self.answers:
            self._read_until(lambda line: key in self.answers, f"the result of {key!r}", timeout)
        answer = self.answers[key]
        assert "ok" in answer, answer["error"] + "\n" + "".join(self.log[-60:])
        return answer["ok"]

    def close(self):
        try:
            # Closes stdin (the driver then waits for its scenarios and shuts Ray down) and reads
            # what is left, so that a scenario still running is not blocked on a full pipe.
            self.proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def driver(request, tmp_path_factory):
    if not _have_ray():
        pytest.skip("Ray is not installed (pip install -e '.[test]' installs it)")
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"]).returncode != 0:
        pytest.skip(
            "needs `unshare -n` (Linux, root) to keep Ray's traffic inside a "
            "loopback-only namespace"
        )
    d = Driver()
    selected = {item.name for item in request.session.items if item.module is request.module}
    scenarios = dict.fromkeys(s for test, s in SCENARIOS.items() if test in selected)
    for scenario in scenarios:
        args = {"main_group": [str(tmp_path_factory.mktemp("ray"))], "cli": [CLI_ARGS]}
        d.submit(scenario, *args.get(scenario, []))
    yield d
    d.close()


@pytest.mark.multiprocess
def test_two_workers_train_digits_with_identical_weights(driver):
    outputs = driver.result("main_group")["training"]
    print("val_accuracy per worker:", [o["val_accuracy"] for o in outputs])
    assert [o["tf_config"]["task"]["index"] for o in outputs] == [0, 1]
    for o in outputs:
        assert o["replicas"] == 2
        # It learned: 0.944 in a suite run once each worker took its part of every global batch.
        assert o["val_accuracy"] >= 0.93
        assert o["intra_op_threads"] == 1  # one CPU per worker (Ray's default resources)
        assert all(w.startswith("127.0.0.1:") for w in o["tf_config"]["cluster"]["worker"])
    assert outputs[0]["digest"] == outputs[1]["digest"]


@pytest.mark.multiprocess
@pytest.mark.fault
def test_killed_worker_resumes_from_rays_checkpoint_bitwise(driver):
    # rank 1 os._exit's after global batch 21 (22 updates; 16 per epoch, a backup every 2). Each
    # attempt has a fresh backup_dir, so the resume can only come from ray.train.get_checkpoint().
    out = driver.result("main_group")["fault"]
    print("fault scenario:", json.dumps(out))
    assert out["attempts"] == [2, 2] and out["iterations"] == [32, 32]
    assert out["restored"] is not None and 16 <= out["restored"]["updates"] <= 22
    assert out["restored"]["updates"] % 2 == 0
    assert out["same_weights_as_uninterrupted"]
    assert (
        out["metrics"]["updates"] == 32
        and out["metrics"]["epoch"] == 2
        and "loss" in out["metrics"]
    )
    assert out["checkpoint_state"]["updates"] == 32  # Result.checkpoint is the final backup


@pytest.mark.multiprocess
def test_rays_tensorflow_quickstart_flow_with_tfdist_imported(driver):
    out = driver.result("quickstart")
    assert out["error"] == "None"
    assert out["has_checkpoint"] and "loss" in out["metrics"]


@pytest.mark.multiprocess
def test_ray_data_shards_feed_the_trainer(driver):
    outputs = driver.result("main_group")["ray_data"]
    assert outputs[0]["digest"] == outputs[1]["digest"]
    assert outputs[0]["accuracy"] > 0.5


@pytest.mark.multiprocess
def test_cli_engine_ray(driver):
    out = driver.result("cli")
    assert out["returncode"] == 0, out["output"]
    assert "replicas=2" in out["output"] and "final val_accuracy=" in out["output"]
    assert "\x1b[" not in out["output"]  # a log, not a terminal: no colour codes


@pytest.mark.multiprocess
def test_more_workers_than_cpus_fails_before_waiting(driver):
    out = driver.result("too_many_workers")
    assert out["error"].startswith(
        "Invalid value for argument `num_workers`. Received: num_workers=64. "
        f"Expected at most {NUM_CPUS} (the Ray cluster has {NUM_CPUS} CPUs"
    )
    assert "wait for the missing resources forever" in out["error"]


def test_ray_not_installed_says_how_to_install():
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from tfdist.launch import ray_launcher\n"
        "try:\n    ray_launcher(print, num_workers=2)\n"
        "except ImportError as e:\n    print('ERROR', e)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    assert (
        "ERROR Ray is not installed. Install it with: pip install 'tfdist[ray]'" in proc.stdout
    ), proc.stdout


def test_unknown_engine_is_rejected():
    proc = run_tfdist("train", "--engine=rya", timeout=120)
    assert proc.returncode == 2
    assert (
        "tfdist train: error: Invalid value for argument `engine`. Received: engine='rya'. "
        "Expected one of: local, ray."
    ) in proc.stdout


def test_importing_tfdist_launch_imports_no_ray():
    code = "import sys, tfdist.launch; tfdist.launch.notebook_launcher; print('ray' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
        stdout=subprocess.PIPE,
        text=True,
        timeout=60,
    )
    assert proc.stdout.strip() == "False"


def test_a_worker_range_makes_rays_scaling_config_elastic():
    # Ray Train V2's elastic training: ScalingConfig(num_workers=(min, max)). No cluster needed.
    pytest.importorskip("ray.train")
    from tfdist.launch.ray.engine import scaling_config

    elastic = scaling_config((1, 4), use_gpu=False, cpus_per_worker=1)
    assert elastic.elasticity_enabled and (elastic.min_workers, elastic.max_workers) == (1, 4)
    fixed = scaling_config(2, use_gpu=False, cpus_per_worker=0.5)
    assert not fixed.elasticity_enabled and fixed.num_workers == 2
    assert fixed.resources_per_worker == {"CPU": 0.5}


@pytest.mark.parametrize("bad", [(0, 2), (3, 2), (1, 2, 3), [1, 2], (1, "2"), 0, True])
def test_bad_worker_ranges_are_refused(bad):
    from tfdist.launch.ray.engine import worker_range

    with pytest.raises(ValueError, match=r"Invalid value for argument `num_workers`"):
        worker_range(bad)


def test_ray_launcher_takes_ray_fits_keyword_arguments_and_no_others():
    import inspect

    from tfdist.launch.ray.engine import ray_fit, ray_launcher

    launcher, fit = inspect.signature(ray_launcher), inspect.signature(ray_fit)
    assert list(launcher.parameters.values()) == list(fit.parameters.values())
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_worker'"):
        ray_launcher(print, num_worker=2)  # refused before anything starts
