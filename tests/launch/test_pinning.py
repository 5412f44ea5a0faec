"""CPU pinning of a local launch: the layout (pure), then real processes and what they see."""

import io
import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import run_tfdist
from tfdist.launch import local, manifests, pinning, slurm_pin
from tfdist.launch.pinning import Pinning, pin_layout

CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
THREAD_VARS = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


# -- the layout ---------------------------------------------------------------
def test_two_workers_on_two_cores_get_one_each():
    assert pin_layout([("worker", 0), ("worker", 1)], [0, 1]) == {
        "worker:0": Pinning((0,)),
        "worker:1": Pinning((1,)),
    }
    one = Pinning((0,))
    assert (one.intra_op_threads, one.inter_op_threads) == (1, 2)  # collectives need 2
    assert one.env() == {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2"}
    assert str(one) == "cpus 0 (intra-op 1, inter-op 2)"


def test_two_workers_on_four_cores_get_two_each():
    layout = pin_layout([("worker", 0), ("worker", 1)], [3, 2, 1, 0])
    assert layout == {"worker:0": Pinning((0, 1)), "worker:1": Pinning((2, 3))}
    assert str(layout["worker:1"]) == "cpus 2-3 (intra-op 2, inter-op 2)"


def test_a_chief_and_two_workers_on_two_cores_are_not_pinned():
    tasks = [("chief", 0), ("worker", 0), ("worker", 1)]
    assert pin_layout(tasks, [0, 1]) == {"chief:0": None, "worker:0": None, "worker:1": None}
    assert "3 training tasks (chief and workers) do not fit on the 2 CPU(s)" in (
        pinning.unpinned_reason(tasks, [0, 1])
    )


def test_parameter_servers_and_evaluators_keep_every_cpu():
    # The training tasks share the cores; a ps serves every worker, so it stays on all of them.
    assert pin_layout([("worker", 0), ("ps", 0)], [0, 1]) == {
        "worker:0": Pinning((0, 1)),
        "ps:0": None,
    }
    tasks = [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0), ("evaluator", 0)]
    assert pin_layout(tasks, [4, 5, 6, 7, 8, 9, 10]) == {
        "chief:0": Pinning((4, 5)),
        "worker:0": Pinning((6, 7)),
        "worker:1": Pinning((8, 9)),  # cpu 10 is left to the unpinned tasks
        "ps:0": None,
        "evaluator:0": None,
    }
    assert pin_layout([("ps", 0)], [0, 1]) == {"ps:0": None}


def test_cpu_list_notation():
    assert pinning.cpu_list([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"


def test_pin_false_or_too_few_cpus_pins_nothing_and_says_why(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="tfdist.launch")
    tasks = [("worker", 0), ("worker", 1)]
    assert pinning.plan_pinning(tasks, pin=False) == {}
    assert "Not pinning tasks to CPUs: pin=False (--pin=false, or launch(pin=False))" in caplog.text
    monkeypatch.setattr(pinning, "launcher_cpus", lambda: [3])
    assert pinning.plan_pinning(tasks, pin=True) == {}
    assert "2 training tasks (chief and workers) do not fit on the 1 CPU(s)" in caplog.text


# -- real processes -------------------------------------------------------------
needs_two_cpus = pytest.mark.skipif(
    len(CPUS) < 2 or not sys.platform.startswith("linux"), reason="needs Linux and 2 CPUs"
)
_REPORT = (
    "import json, os\n"
    "names = ('TF_NUM_INTRAOP_THREADS', 'TF_NUM_INTEROP_THREADS')\n"
    "report = {k: os.environ.get(k) for k in names}\n"
    "print(json.dumps({'cpus': sorted(os.sched_getaffinity(0)), **report}))\n"
)


def _reports(output):
    """``task label -> [the JSON line each run of it printed]`` from prefixed output."""
    reports = {}
    for line in output.splitlines():
        prefix, _, payload = line.partition("] ")
        if prefix.startswith("[") and payload.startswith("{"):
            reports.setdefault(prefix[1:], []).append(json.loads(payload))
    return reports


@needs_two_cpus
def test_launch_gives_each_worker_its_own_cores_and_thread_pools():
    proc = run_tfdist("launch", "--workers=2", "--", sys.executable, "-c", _REPORT, timeout=120)
    assert proc.returncode == 0, proc.stdout
    reports = _reports(proc.stdout)
    half = len(CPUS) // 2
    for k, cpus in enumerate([CPUS[:half], CPUS[half : 2 * half]]):
        (report,) = reports[f"worker:{k}"]
        assert report == {
            "cpus": cpus,
            "TF_NUM_INTRAOP_THREADS": str(half),
            "TF_NUM_INTEROP_THREADS": str(max(2, half)),
        }
        assert f"worker:{k} -> cpus " in proc.stdout  # the launcher's line for it


@needs_two_cpus
def test_pin_false_leaves_every_task_on_every_cpu():
    proc = run_tfdist(
        "launch", "--workers=2", "--pin=false", "--", sys.executable, "-c", _REPORT, timeout=120
    )
    assert proc.returncode == 0, proc.stdout
    reports = _reports(proc.stdout)
    for k in range(2):
        (report,) = reports[f"worker:{k}"]
        assert report == {"cpus": CPUS, **{v: os.environ.get(v) for v in THREAD_VARS}}
    assert "Not pinning tasks to CPUs: pin=False (--pin=false, or launch(pin=False))" in proc.stdout


@needs_two_cpus
def test_a_restarted_group_keeps_its_cores(tmp_path):
    # Each worker reports, then worker:1 fails once: the group restarts and reports again.
    flaky = _REPORT + textwrap.dedent("""
        import pathlib, sys
        task = json.loads(os.environ['TF_CONFIG'])['task']
        marker = pathlib.Path(sys.argv[1]) / f"{task['type']}-{task['index']}"
        marker.write_text(marker.read_text() + 'x' if marker.exists() else 'x')
        first = task['index'] == 1 and marker.read_text() == 'x'
        while first and not (marker.parent / 'worker-0').exists():  # worker:0 has reported
            pass
        sys.exit(3 if first else 0)
    """)
    out = io.StringIO()
    rc = local.launch(
        [sys.executable, "-c", flaky, str(tmp_path)], workers=2, max_restarts=1, output=out
    )
    assert rc == 0, out.getvalue()
    reports = _reports(out.getvalue())
    assert len(reports["worker:1"]) == 2
    for label, runs in reports.items():
        assert all(run == runs[0] for run in runs), (label, runs)
    assert not set(reports["worker:0"][0]["cpus"]) & set(reports["worker:1"][0]["cpus"])


# -- TensorFlow reads the thread counts from the environment ------------------------
_THREADS = textwrap.dedent("""
    import os
    import tensorflow as tf
    before = len(os.listdir("/proc/self/task"))
    x = tf.random.uniform((256, 256))
    tf.linalg.matmul(x, x).numpy()  # creates the eager context and its thread pools
    print(len(os.listdir("/proc/self/task")) - before)
""")


def _tf_threads(intra, inter):
    """Threads TF starts for its first op with these TF_NUM_*_THREADS (on this process's CPUs)."""
    env = {**os.environ, "TF_NUM_INTRAOP_THREADS": str(intra), "TF_NUM_INTEROP_THREADS": str(inter)}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    proc = subprocess.run(
        [sys.executable, "-c", _THREADS], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/self/task")
def test_tensorflow_sizes_its_pools_from_the_environment():
    # Each extra intra-op or inter-op thread asked for is one more thread: TF honours the variables.
    assert _tf_threads(1 + 3, 2 + 5) - _tf_threads(1, 2) == 3 + 5


def test_kubernetes_manifests_refuse_pin():
    # Kubernetes places each pod on CPUs itself: --pin is for `tfdist launch` and Slurm scripts.
    proc = run_tfdist("manifest", "kubernetes", "--pin=false", "--", "true", timeout=60)
    assert proc.returncode == 2 and "no --pin for `tfdist manifest kubernetes`" in proc.stdout


# -- Slurm: each task pins itself (tfdist.launch.slurm_pin) --------------------------
def _slurm_env(procid, tasks_per_node="2", nodes="node1", roles=None, **extra):
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(procid),
        "SLURM_STEP_NODELIST": nodes,
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        **extra,
    }
    if roles:
        env["TFDIST_SLURM_ROLES"] = roles
    return env


def test_slurm_tasks_of_a_node_split_its_cpus_in_rank_order():
    assert slurm_pin.task_pinning(_slurm_env(1), [0, 1]) == (
        "worker:1",
        Pinning((1,)),
        "its share of CPUs 0-1 among 2 training tasks",
    )
    # Node 1 of 2 holds ranks 2-3: rank 3 is that node's second task.
    env = _slurm_env(3, tasks_per_node="2(x2)", nodes="node[1-2]")
    assert slurm_pin.task_pinning(env, [0, 1, 2, 3])[:2] == ("worker:3", Pinning((2, 3)))


def test_slurm_ps_keeps_every_cpu_and_the_training_tasks_share_them():
    roles = "chief:1,ps:1,worker:2"
    env = _slurm_env(1, tasks_per_node="4", roles=roles)
    assert slurm_pin.task_pinning(env, [0, 1, 2, 3, 4, 5]) == (
        "ps:0",
        None,
        "parameter servers and evaluators see every CPU",
    )
    env = _slurm_env(3, tasks_per_node="4", roles=roles)
    assert slurm_pin.task_pinning(env, [0, 1, 2, 3, 4, 5])[:2] == ("worker:1", Pinning((4, 5)))
    # Three training tasks do not fit on two CPUs: none is pinned, and the task says why.
    env = _slurm_env(0, tasks_per_node="4", roles=roles)
    assert (
        "3 training tasks (chief and workers) do not fit" in slurm_pin.task_pinning(env, [0, 1])[2]
    )


def test_slurm_bound_tasks_keep_slurms_cpus():
    env = _slurm_env(1, SLURM_CPU_BIND_TYPE="mask_cpu:")
    assert slurm_pin.task_pinning(env, [6, 7]) == (
        "worker:1",
        Pinning((6, 7)),
        "the CPUs Slurm bound it to",
    )
    for unbound in ("", "none", "quiet,none", "verbose,none"):
        assert not slurm_pin.slurm_bound({"SLURM_CPU_BIND_TYPE": unbound}), unbound


def test_slurm_script_runs_each_task_through_slurm_pin_unless_pin_is_false():
    command = [sys.executable, "-m", "tfdist", "train"]
    pinned = manifests.slurm_script(command, ntasks=2)
    assert f"{sys.executable} -m tfdist.launch.slurm_pin -- {sys.executable} -m tfdist" in pinned
    assert "tfdist.launch.slurm_pin" not in manifests.slurm_script(command, ntasks=2, pin=False)
    with pytest.raises(ValueError, match=r"argument `pin`. Received: pin='no'"):
        manifests.slurm_script(command, ntasks=2, pin="no")


@needs_two_cpus
def test_a_slurm_task_pins_itself_then_runs_its_command():
    # srun's variables, as on a node with two tasks: the task on rank 1 gets the second half.
    env = {**os.environ, **_slurm_env(1), "TF_NUM_INTRAOP_THREADS": "9"}
    proc = subprocess.run(
        [sys.executable, "-m", "tfdist.launch.slurm_pin", "--", sys.executable, "-c", _REPORT],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    half = len(CPUS) // 2
    assert json.loads(proc.stdout) == {
        "cpus": CPUS[half : 2 * half],
        "TF_NUM_INTRAOP_THREADS": str(half),
        "TF_NUM_INTEROP_THREADS": str(max(2, half)),
    }
    assert f"tfdist: slurm task worker:1 -> cpus {pinning.cpu_list(CPUS[half : 2 * half])}" in (
        proc.stderr
    )
    assert "replaced TF_NUM_INTRAOP_THREADS" in proc.stderr  # the user's value, replaced aloud
    bad = subprocess.run(
        [sys.executable, "-m", "tfdist.launch.slurm_pin", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "Expected `-- COMMAND...`" in bad.stderr
