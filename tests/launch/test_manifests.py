"""Tests for tfdist.launch.manifests: Slurm scripts and Kubernetes manifests (no cluster needed)."""

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from tfdist import cluster as cluster_lib
from tfdist.launch import manifests

COMMAND = ["python", "train.py", "--epochs=3", "a b", "it's"]
# What srun runs: the command's own Python pins the task first (tfdist.launch.slurm_pin).
PINNED = ["python", "-m", "tfdist.launch.slurm_pin", "--", *COMMAND]


# --- a small schema checker for the fields we set ---------------------------------------------
# A schema is a type (isinstance), a literal (==), [item_schema] (non-empty list), or a dict whose
# keys are all required ("key?" is optional) and which allows no other keys.


def check_schema(value, schema, path="$"):
    if isinstance(schema, type):
        assert isinstance(value, schema) and not (schema is int and isinstance(value, bool)), (
            f"{path}: {value!r} is not {schema.__name__}"
        )
    elif isinstance(schema, list):
        assert isinstance(value, list) and value, f"{path}: {value!r} is not a non-empty list"
        for i, item in enumerate(value):
            check_schema(item, schema[0], f"{path}[{i}]")
    elif isinstance(schema, dict):
        assert isinstance(value, dict), f"{path}: {value!r} is not a mapping"
        keys = {k.rstrip("?"): k.endswith("?") for k in schema}
        assert not set(value) - set(keys), (
            f"{path}: unexpected keys {sorted(set(value) - set(keys))}"
        )
        for key, optional in keys.items():
            if key in value:
                check_schema(value[key], schema[key + "?" if optional else key], f"{path}.{key}")
            else:
                assert optional, f"{path}: missing key {key!r}"
    else:
        assert value == schema, f"{path}: {value!r} != {schema!r}"


PORTS = [{"containerPort": 2222, "name": "tfjob-port"}]
CONTAINER = {"name": "tensorflow", "image": str, "command": [str], "args?": [str], "ports": PORTS}
REPLICA = {
    "replicas": int,
    "restartPolicy": "OnFailure",
    "template": {"spec": {"containers": [CONTAINER]}},
}
TFJOB = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "TFJob",
    "metadata": {"name": str},
    "spec": {"tfReplicaSpecs": {"Chief?": REPLICA, "Worker": REPLICA, "PS?": REPLICA}},
}
SERVICE = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": str},
    "spec": {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": {manifests.JOB_LABEL: str},
        "ports": [{"name": "tfjob-port", "port": 2222, "targetPort": 2222}],
    },
}
INDEXED_JOB = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": str},
    "spec": {
        "completionMode": "Indexed",
        "completions": int,
        "parallelism": int,
        "backoffLimit": 0,
        "template": {
            "metadata": {"labels": {manifests.JOB_LABEL: str}},
            "spec": {"subdomain": str, "restartPolicy": "Never", "containers": [CONTAINER]},
        },
    },
}


def test_schema_checker_catches_mistakes():
    doc = yaml.safe_load(manifests.kubernetes_manifest(COMMAND, workers=1, image="img"))
    check_schema(doc, TFJOB)
    doc["spec"]["tfReplicaSpecs"]["Worker"]["restartpolicy"] = "Never"
    with pytest.raises(AssertionError, match="unexpected keys"):
        check_schema(doc, TFJOB)
    worker = doc["spec"]["tfReplicaSpecs"]["Worker"]
    del worker["restartpolicy"], worker["restartPolicy"]
    with pytest.raises(
        AssertionError, match=r"\$.spec.tfReplicaSpecs.Worker: missing key 'restartPolicy'"
    ):
        check_schema(doc, TFJOB)


# --- Slurm -------------------------------------------------------------------------------------


def test_slurm_script_directives_and_srun_line():
    text = manifests.slurm_script(
        COMMAND, nnodes=2, workers=4, partition="gpu", time="1-02:00:00", job_name="mnist"
    )
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    directives = [line.split(" ", 1)[1] for line in lines if line.startswith("#SBATCH ")]
    assert directives == [
        "--job-name=mnist",
        "--nodes=2",
        "--ntasks-per-node=4",
        "--partition=gpu",
        "--time=1-02:00:00",
    ]
    # sbatch reads #SBATCH lines only before the first command.
    first_command = next(
        i for i, line in enumerate(lines[1:], 1) if line and not line.startswith("#")
    )
    assert all(i < first_command for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    srun = [line for line in lines if line.startswith("srun ")]
    assert len(srun) == 1
    argv = shlex.split(srun[0])
    assert argv[:4] == ["srun", "--nodes=2", "--ntasks-per-node=4", "--kill-on-bad-exit=1"]
    assert argv[4:] == PINNED  # Quoted so the shell gives back exactly the command.
    assert lines.index(srun[0]) > next(
        i for i, line in enumerate(lines) if line.startswith("unset TF_CONFIG")
    )
    assert (
        f"port {cluster_lib.SLURM_PORT_BASE} + {cluster_lib.SLURM_PORTS_PER_JOB} * "
        f"(job id % {cluster_lib.SLURM_PORT_BLOCKS}) + k"
    ) in text
    assert "--requeue" not in text and "TFDIST_SLURM_ROLES" not in text


def test_slurm_script_is_valid_bash_and_defaults():
    text = manifests.slurm_script(["true"], nnodes=1, workers=1)
    assert "#SBATCH --partition" not in text and "#SBATCH --time" not in text
    assert "#SBATCH --job-name=tfdist" in text
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def slurm_env(procid, nodes=("node1", "node2"), tasks_per_node=2):
    """The variables srun sets for task ``procid`` of a block-distributed step."""
    return {
        "SLURM_JOB_ID": "42",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(procid),
        "SLURM_NTASKS": str(len(nodes) * tasks_per_node),
        "SLURM_NNODES": str(len(nodes)),
        "SLURM_NODEID": str(procid // tasks_per_node),
        "SLURM_LOCALID": str(procid % tasks_per_node),
        "SLURM_STEP_NODELIST": "node[1-2]",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": f"{tasks_per_node}(x{len(nodes)})",
        "SLURM_TASKS_PER_NODE": f"{tasks_per_node}(x{len(nodes)})",
    }


def test_slurm_environment_gives_every_task_a_consistent_cluster():
    """2 nodes x 2 tasks, as the generated script's srun starts them."""
    infos = [cluster_lib.from_environment(slurm_env(procid)) for procid in range(4)]
    base = cluster_lib.slurm_port_base(42)
    expected = {
        "worker": [f"node1:{base}", f"node1:{base + 1}", f"node2:{base}", f"node2:{base + 1}"]
    }
    for procid, info in enumerate(infos):
        env = slurm_env(procid)
        assert info.cluster == expected
        assert (info.task_type, info.task_id) == ("worker", procid)
        # The task listens on its own node, at the port the script's comment promises.
        node = ["node1", "node2"][int(env["SLURM_NODEID"])]
        assert info.address == f"{node}:{base + int(env['SLURM_LOCALID'])}"
        # Equivalent to a valid TF_CONFIG.
        assert cluster_lib.parse_tf_config(json.dumps(info.to_tf_config())) == info
    assert [info.is_chief for info in infos] == [True, False, False, False]


def test_make_strategy_multi_worker_reads_slurm(monkeypatch):
    """make_strategy("multi_worker") gets its cluster from Slurm (the strategy is fake: no net)."""
    import tensorflow as tf

    import tfdist

    for name in list(os.environ):
        if name.startswith("SLURM_") or name == "TF_CONFIG":
            monkeypatch.delenv(name)
    for name, value in slurm_env(3).items():
        monkeypatch.setenv(name, value)
    built = {}

    def fake_strategy(cluster_resolver=None, communication_options=None):
        built["resolver"] = cluster_resolver
        return "fake-strategy"

    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", fake_strategy)
    # "auto" finds the Slurm cluster: it builds the (faked) MultiWorkerMirroredStrategy.
    assert tfdist.make_strategy("auto") == "fake-strategy"
    assert tfdist.make_strategy("multi_worker") == "fake-strategy"
    resolver = built["resolver"]
    base = cluster_lib.slurm_port_base(42)
    assert resolver.cluster_spec().as_dict() == {
        "worker": [f"node1:{base}", f"node1:{base + 1}", f"node2:{base}", f"node2:{base + 1}"]
    }
    assert (resolver.task_type, resolver.task_id) == ("worker", 3)


@pytest.mark.parametrize(
    "kwargs, name, received",
    [
        ({"nnodes": 0}, "nnodes", "0"),
        ({"workers": 0}, "workers", "0"),
        ({"workers": 40}, "ntasks", "80"),  # 40 per node: more than a job's block of ports.
        ({"workers": None, "ntasks": 3}, "ntasks", "3"),  # Not a multiple of nnodes=2.
        (
            {"workers": None, "ntasks": 2, "chief": True, "ps": 1},
            "ntasks",
            "2",
        ),  # No task left for a worker.
        ({"workers": 1, "ntasks": 2}, "workers", "1"),
        ({"ps": 1}, "ps", "1"),  # Without a chief.
        ({"max_restarts": -1}, "max_restarts", "-1"),
        ({"partition": "gpu debug"}, "partition", "'gpu debug'"),
        ({"job_name": "a\nb"}, "job_name", r"'a\\nb'"),
        ({"time": "1 hour"}, "time", "'1 hour'"),
        ({"command": "python train.py"}, "command", "'python train.py'"),
        ({"min_nodes": 0}, "min_nodes", "0"),
        ({"min_nodes": 3}, "min_nodes", "3"),  # More than nnodes=2.
        ({"min_nodes": 1, "chief": True}, "min_nodes", "1"),  # Roles need a fixed task count.
        ({"min_nodes": 1, "workers": None, "ntasks": 4}, "min_nodes", "1"),
    ],
)
def test_slurm_errors(kwargs, name, received):
    kwargs = {"command": ["true"], "nnodes": 2, "workers": 2, **kwargs}
    with pytest.raises(
        ValueError, match=rf"argument `{name}`. Received: {name}={received}. Expected"
    ):
        manifests.slurm_script(kwargs.pop("command"), **kwargs)


def test_slurm_ntasks_not_divisible_into_roles_message():
    with pytest.raises(
        ValueError,
        match=r"`ntasks`. Received: ntasks=2. Expected at least 3. The roles need 1 chief, "
        r"1 ps and at least one worker.",
    ):
        manifests.slurm_script(["true"], ntasks=2, chief=True, ps=1)
    with pytest.raises(
        ValueError, match=r"`ntasks`. Received: ntasks=5. Expected a multiple of nnodes=2"
    ):
        manifests.slurm_script(["true"], nnodes=2, ntasks=5)


def test_slurm_script_with_parameter_servers_and_requeue():
    text = manifests.slurm_script(COMMAND, ntasks=4, chief=True, ps=1, max_restarts=2)
    lines = text.splitlines()
    assert [line for line in lines if line.startswith("#SBATCH")] == [
        "#SBATCH --job-name=tfdist",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
    ]
    assert "export TFDIST_SLURM_ROLES=chief:1,ps:1,worker:2" in lines
    srun = shlex.split(next(line for line in lines if line.startswith("srun ")).rstrip(" &"))
    assert srun[:4] == ["srun", "--nodes=1", "--ntasks-per-node=4", "--kill-on-bad-exit=0"]
    assert srun[-len(COMMAND) :] == COMMAND
    assert (
        'scontrol requeue "$SLURM_JOB_ID"' in text and '"${SLURM_RESTART_COUNT:-0}" -lt 2' in text
    )
    # A preemption (75) and a hang the watchdog found (76) requeue; other failures do not.
    assert '{ [ "$rc" -eq 75 ] || [ "$rc" -eq 76 ]; }' in text
    # The roles the script exports give a valid cluster to each rank.
    env = {
        "SLURM_JOB_ID": "3",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NODELIST": "vm",
        "SLURM_NTASKS": "4",
        "SLURM_STEP_TASKS_PER_NODE": "4",
        "TFDIST_SLURM_ROLES": "chief:1,ps:1,worker:2",
    }
    assert [
        cluster_lib.from_environment(dict(env, SLURM_PROCID=str(r))).task_type for r in range(4)
    ] == ["chief", "ps", "worker", "worker"]
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)
        requeue_only = manifests.slurm_script(COMMAND, ntasks=2, max_restarts=1)
        assert "srun --nodes=1 --ntasks-per-node=2 --wait=60 " in requeue_only
        subprocess.run(["bash", "-n"], input=requeue_only, text=True, check=True)


# --- Kubernetes: TFJob ------------------------------------------------------------------------


def test_tfjob_with_chief_workers_and_ps():
    text = manifests.kubernetes_manifest(
        COMMAND, workers=3, ps=2, chief=True, image="reg.example/train:1", name="mnist"
    )
    # Every replica shares one container dict: it is written out in full, not as YAML aliases.
    assert "&id" not in text and "*id" not in text
    docs = list(yaml.safe_load_all(text))
    assert len(docs) == 1
    job = docs[0]
    check_schema(job, TFJOB)
    assert job == manifests.tfjob(
        COMMAND, workers=3, ps=2, chief=True, image="reg.example/train:1", name="mnist"
    )
    assert job["metadata"]["name"] == "mnist"
    specs = job["spec"]["tfReplicaSpecs"]
    assert {t: s["replicas"] for t, s in specs.items()} == {"Chief": 1, "Worker": 3, "PS": 2}
    for spec in specs.values():
        container = spec["template"]["spec"]["containers"][0]
        assert container["image"] == "reg.example/train:1"
        assert container["command"] + container["args"] == COMMAND


def test_tfjob_workers_only():
    job = yaml.safe_load(manifests.kubernetes_manifest(["python"], workers=2, image="img"))
    check_schema(job, TFJOB)
    assert list(job["spec"]["tfReplicaSpecs"]) == ["Worker"]
    assert (
        "args" not in job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    )


# --- Kubernetes: indexed Job + headless Service --------------------------------------------------


def test_indexed_job_and_service():
    docs = list(
        yaml.safe_load_all(
            manifests.kubernetes_manifest(
                COMMAND, workers=3, image="img", name="mnist", kind="indexed-job"
            )
        )
    )
    service, job = docs
    check_schema(service, SERVICE)
    check_schema(job, INDEXED_JOB)
    pod = job["spec"]["template"]
    assert (
        service["metadata"]["name"]
        == job["metadata"]["name"]
        == pod["spec"]["subdomain"]
        == "mnist"
    )
    assert service["spec"]["selector"] == pod["metadata"]["labels"]
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    assert pod["spec"]["containers"][0]["args"] == COMMAND


@pytest.mark.skipif(not os.path.exists("/bin/sh"), reason="needs /bin/sh")
def test_indexed_job_pods_build_tf_config_from_their_index():
    """Runs each pod's container command locally, JOB_COMPLETION_INDEX set as by Kubernetes."""
    _, job = manifests.indexed_job(["unused"], workers=3, image="img", name="mnist")
    container = job["spec"]["template"]["spec"]["containers"][0]
    show = [sys.executable, "-c", "import os; print(os.environ['TF_CONFIG'])"]
    addresses = ["mnist-0.mnist:2222", "mnist-1.mnist:2222", "mnist-2.mnist:2222"]
    for index in range(3):
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "JOB_COMPLETION_INDEX": str(index)}
        out = subprocess.run(
            container["command"] + show, env=env, capture_output=True, text=True, check=True
        ).stdout
        info = cluster_lib.parse_tf_config(out)
        assert info.cluster == {"worker": addresses}
        assert (info.task_type, info.task_id, info.address) == ("worker", index, addresses[index])


# --- Kubernetes errors and YAML ----------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, name, received",
    [
        ({"kind": "deployment"}, "kind", "'deployment'. Expected one of: indexed-job, tfjob"),
        ({"workers": 0}, "workers", "0"),
        ({"ps": -1}, "ps", "-1"),
        ({"image": None}, "image", "None"),
        ({"image": "a b"}, "image", "'a b'"),
        ({"name": "MNIST"}, "name", "'MNIST'"),
        ({"name": "1job"}, "name", "'1job'"),
        ({"name": "job-"}, "name", "'job-'"),
        ({"name": "x" * 60}, "name", "'x{60}'"),
        ({"command": []}, "command", r"\[\]"),
        ({"kind": "indexed-job", "ps": 1}, "ps", "1. Expected 0 with kind='indexed-job'"),
        (
            {"kind": "indexed-job", "chief": True},
            "chief",
            "True. Expected False with kind='indexed-job'",
        ),
    ],
)
def test_kubernetes_errors(kwargs, name, received):
    kwargs = {"command": ["true"], "workers": 2, "image": "img", **kwargs}
    with pytest.raises(ValueError, match=rf"argument `{name}`. Received: {name}={received}"):
        manifests.kubernetes_manifest(kwargs.pop("command"), **kwargs)


def test_name_length_accounts_for_derived_names():
    name = "x" * (63 - len("-worker-9"))
    manifests.tfjob(["true"], workers=10, image="img", name=name)
    with pytest.raises(ValueError, match=r"at most 53 characters.*'x+-worker-10'"):
        manifests.tfjob(["true"], workers=11, image="img", name=name)


def test_yaml_round_trips_awkward_values():
    doc = {
        "strings": [
            "yes",
            "No",
            "on",
            "null",
            "~",
            "None",
            "1.5",
            "0x1F",
            "2024-01-01",
            "a: b",
            "#c",
            "- d",
            "'q'",
            '"dq"',
            "multi\nline",
            "tab\tand\\back",
            "ünï",
            "\x7f",
            "",
            " pad ",
            "@x",
            "*y",
            "{z}",
            "plain-word.v1/x",
        ],
        "numbers": [0, -3, 2.5],
        "flags": [True, False],
        "nothing": None,
        "empty": {},
        "none": [],
        "nested": [{"a": [1, {"b": "c"}]}, [["deep"]]],
        "odd key: #": "v",
    }
    assert yaml.safe_load(manifests.to_yaml([doc])) == doc
    assert list(yaml.safe_load_all(manifests.to_yaml([doc, {"k": 1}]))) == [doc, {"k": 1}]


def test_cli_refuses_ntasks_that_do_not_divide_into_the_roles(tmp_path):
    from tests.helpers import run_tfdist

    proc = run_tfdist(
        "manifest",
        "slurm",
        "--ntasks=2",
        "--chief",
        "--ps=1",
        f"--output={tmp_path / 'job.sbatch'}",
        "--",
        "tfdist",
        "train",
        "--strategy=parameter_server",
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert (
        "tfdist manifest: error: Invalid value for argument `ntasks`. Received: ntasks=2. "
        "Expected at least 3. "
        "The roles need 1 chief, 1 ps and at least one worker."
    ) in proc.stdout
    assert "Traceback" not in proc.stdout and not (tmp_path / "job.sbatch").exists()


def test_slurm_node_range():
    # --nodes=MIN-MAX: Slurm starts the job on 1 to 4 nodes (a requeued run may get another
    # count); srun then runs 2 tasks on every node granted, and a backup resumes there.
    text = manifests.slurm_script(COMMAND, nnodes=4, min_nodes=1, workers=2, max_restarts=2)
    lines = text.splitlines()
    directives = [line.split(" ", 1)[1] for line in lines if line.startswith("#SBATCH ")]
    assert directives[1:3] == ["--nodes=1-4", "--ntasks-per-node=2"]
    assert "# Slurm grants 1-4 nodes: each run trains on those" in text
    (srun,) = [line for line in lines if line.startswith("srun ")]
    assert shlex.split(srun) == ["srun", "--ntasks-per-node=2", "--wait=60", *PINNED]
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    # A range of one is the fixed count.
    fixed = manifests.slurm_script(COMMAND, nnodes=2, min_nodes=2, workers=2)
    assert fixed == manifests.slurm_script(COMMAND, nnodes=2, workers=2)


def test_cli_slurm_node_range_and_kubernetes_refuses_it():
    from tests.helpers import run_tfdist

    command = ["--", "tfdist", "train", "--strategy=multi_worker", "--backup_dir=/shared/b"]
    proc = run_tfdist(
        "manifest", "slurm", "--nnodes=4", "--min_nodes=2", "--workers=1", *command, timeout=120
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "#SBATCH --nodes=2-4\n#SBATCH --ntasks-per-node=1\n" in proc.stdout
    proc = run_tfdist("manifest", "kubernetes", "--image=i", "--min_nodes=2", *command, timeout=120)
    assert proc.returncode == 2
    assert "Received: min_nodes=2. Expected no --min_nodes for `tfdist manifest kubernetes`" in (
        proc.stdout
    )
