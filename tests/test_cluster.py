"""Tests for tfdist.cluster: TF_CONFIG and Slurm parsing, loopback clusters, ports."""

import json
import socket

import pytest

from tfdist import cluster as cluster_lib
from tfdist.cluster import ClusterInfo, from_environment, from_slurm, make_cluster, parse_tf_config

CLUSTER = {
    "chief": ["127.0.0.1:2000"],
    "worker": ["127.0.0.1:2001", "127.0.0.1:2002"],
    "ps": ["127.0.0.1:2003"],
}


def tf_config(cluster=CLUSTER, task_type="worker", index=0, **extra):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}, **extra})


# --- parse_tf_config: valid input ------------------------------------------------------------


@pytest.mark.parametrize("raw", [None, "", "   "])
def test_empty_tf_config_is_none(raw):
    assert parse_tf_config(raw) is None


def test_parse_tf_config_and_properties():
    info = parse_tf_config(tf_config(index=1))
    assert info == ClusterInfo(cluster=CLUSTER, task_type="worker", task_id=1)
    assert info.address == "127.0.0.1:2002"
    assert info.num_workers == 3
    assert not info.is_chief
    assert parse_tf_config(tf_config(task_type="chief")).is_chief
    assert parse_tf_config(json.loads(tf_config(task_type="ps"))).task_type == "ps"


def test_worker_zero_is_chief_without_chief_task():
    info = parse_tf_config(tf_config(cluster={"worker": ["localhost:1", "localhost:2"]}))
    assert info.is_chief and info.num_workers == 2
    assert not parse_tf_config(tf_config()).is_chief  # The cluster has a chief.


def test_to_tf_config_round_trips():
    info = parse_tf_config(tf_config(index=1, rpc_layer="grpc+verbs"))
    assert info.to_tf_config() == {
        "cluster": CLUSTER,
        "task": {"type": "worker", "index": 1},
        "rpc_layer": "grpc+verbs",
    }
    assert parse_tf_config(json.dumps(info.to_tf_config())) == info


def test_evaluator_outside_cluster_is_accepted():
    info = parse_tf_config(tf_config(task_type="evaluator"))
    assert info.task_type == "evaluator" and info.address == "" and not info.is_chief


def test_ipv6_addresses():
    info = parse_tf_config(tf_config(cluster={"worker": ["[::1]:2222"]}))
    assert info.address == "[::1]:2222"


# --- parse_tf_config: every error names the field and the value received ---------------------


@pytest.mark.parametrize(
    "raw, name, received",
    [
        ('{"cluster": ', r"`TF_CONFIG`", r"char 12"),
        ("[1, 2]", r"`TF_CONFIG`", r"\[1, 2\]"),
        (json.dumps({"task": {"type": "worker", "index": 0}}), r"`TF_CONFIG.cluster`", "<missing>"),
        (json.dumps({"cluster": ["a:1"], "task": {}}), r"`TF_CONFIG.cluster`", r"\['a:1'\]"),
        (tf_config(cluster={"worker": []}), r"`TF_CONFIG.cluster.worker`", r"=\[\]"),
        (tf_config(cluster={"worker": "a:1"}), r"`TF_CONFIG.cluster.worker`", "'a:1'"),
        (tf_config(cluster={"worker": ["a:1", "b"]}), r"`TF_CONFIG.cluster.worker\[1\]`", "'b'"),
        (
            tf_config(cluster={"worker": ["a:1", "b:x"]}),
            r"`TF_CONFIG.cluster.worker\[1\]`",
            "'b:x'",
        ),
        (
            tf_config(cluster={"worker": ["a:1", "b:70000"]}),
            r"`TF_CONFIG.cluster.worker\[1\]`",
            "'b:70000'",
        ),
        (tf_config(cluster={"worker": [":1"]}), r"`TF_CONFIG.cluster.worker\[0\]`", "':1'"),
        (tf_config(cluster={"worker": ["a:1", 5]}), r"`TF_CONFIG.cluster.worker\[1\]`", "=5"),
        (json.dumps({"cluster": CLUSTER}), r"`TF_CONFIG.task`", "<missing>"),
        (json.dumps({"cluster": CLUSTER, "task": "worker"}), r"`TF_CONFIG.task`", "'worker'"),
        (
            json.dumps({"cluster": CLUSTER, "task": {"index": 0}}),
            r"`TF_CONFIG.task.type`",
            "<missing>",
        ),
        (
            json.dumps({"cluster": CLUSTER, "task": {"type": "worker"}}),
            r"`TF_CONFIG.task.index`",
            "<missing>",
        ),
        (tf_config(index="0"), r"`TF_CONFIG.task.index`", "'0'"),
        (tf_config(index=True), r"`TF_CONFIG.task.index`", "True"),
        (tf_config(rpc_layer=""), r"`TF_CONFIG.rpc_layer`", "''"),
    ],
)
def test_tf_config_errors(raw, name, received):
    with pytest.raises(
        ValueError, match=rf"Invalid value for argument {name}\. Received: .*{received}"
    ):
        parse_tf_config(raw)


def test_malformed_json_reports_position():
    with pytest.raises(ValueError, match=r"JSON error: .* line 1 column 13 \(char 12\)"):
        parse_tf_config('{"cluster": ')


def test_unknown_task_type_in_cluster():
    with pytest.raises(
        ValueError, match=r"`TF_CONFIG.cluster`.*'wroker'.*chief, worker, ps, evaluator"
    ):
        parse_tf_config(tf_config(cluster={"wroker": ["a:1"]}))


def test_more_than_one_chief():
    with pytest.raises(
        ValueError, match=r"`TF_CONFIG.cluster.chief`.*\['a:1', 'a:2'\].*at most one chief"
    ):
        parse_tf_config(tf_config(cluster={"chief": ["a:1", "a:2"], "worker": ["a:3"]}))


def test_task_type_not_in_cluster_lists_cluster_types():
    with pytest.raises(
        ValueError,
        match=r"`TF_CONFIG.task.type`. Received: TF_CONFIG.task.type='ps'. "
        r"Expected one of: chief, worker",
    ):
        parse_tf_config(tf_config(cluster={"chief": ["a:1"], "worker": ["a:2"]}, task_type="ps"))


@pytest.mark.parametrize("index, valid", [(2, r"\[0, 1\]"), (-1, r"\[0, 1\]")])
def test_task_index_out_of_range(index, valid):
    with pytest.raises(
        ValueError,
        match=rf"`TF_CONFIG.task.index`. Received: TF_CONFIG.task.index={index}.*{valid}",
    ):
        parse_tf_config(tf_config(index=index))


def test_duplicate_address_names_both_tasks():
    with pytest.raises(
        ValueError, match=r"`TF_CONFIG.cluster.ps\[0\]`.*'a:1'.*TF_CONFIG.cluster.worker\[0\]"
    ):
        parse_tf_config(tf_config(cluster={"worker": ["a:1"], "ps": ["a:1"]}))


def test_tf_config_of_wrong_type():
    with pytest.raises(ValueError, match=r"`TF_CONFIG`. Received: TF_CONFIG=42"):
        parse_tf_config(42)


# --- from_environment and Slurm --------------------------------------------------------------

SLURM = {
    "SLURM_JOB_ID": "77",
    "SLURM_PROCID": "4",
    "SLURM_NTASKS": "7",
    "SLURM_STEP_NODELIST": "node[01-02,10],gpu",
    "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
}


def test_from_environment_prefers_tf_config():
    env = dict(SLURM, TF_CONFIG=tf_config(index=1))
    assert from_environment(env).address == "127.0.0.1:2002"


def test_from_environment_none_and_slurm():
    assert from_environment({}) is None
    assert from_environment({"TF_CONFIG": ""}) is None
    assert (
        from_environment({"SLURM_JOB_ID": "1", "SLURM_PROCID": "0"}) is None
    )  # One-task batch script.
    env = {
        "SLURM_JOB_ID": "1",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_TASKS_PER_NODE": "1",
    }
    assert from_environment(env).cluster == {"worker": ["127.0.0.1:10032"]}  # One node: loopback.


def test_interactive_srun_pty_shell_is_not_a_cluster():
    """`srun --pty bash` sets SLURM_PTY_PORT; what runs in that shell is not a cluster task."""
    env = {
        "SLURM_JOB_ID": "9",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_STEP_NODELIST": "vm",
        "SLURM_STEP_TASKS_PER_NODE": "1",
        "SLURM_PTY_PORT": "40713",
        "SLURM_JOB_NAME": "bash",
    }
    assert from_environment(env) is None


def test_allocation_of_several_tasks_outside_srun_is_an_error():
    """The batch script of a 2-task job (or an salloc shell): SLURM_PROCID=0 but no step."""
    env = {
        "SLURM_JOB_ID": "9",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_JOB_NODELIST": "vm",
        "SLURM_TASKS_PER_NODE": "2",
    }
    with pytest.raises(
        ValueError,
        match=r"`SLURM_STEP_ID`. Received: SLURM_STEP_ID=<missing>. Expected the "
        r"variables of a job step that srun starts.*job 9 of 2 tasks.*outside `srun`",
    ):
        from_environment(env)


@pytest.mark.parametrize("missing", ["SLURM_PROCID", "SLURM_STEP_NODELIST"])
def test_job_step_without_the_variables_tfdist_needs(missing):
    env = {
        "SLURM_JOB_ID": "9",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NODELIST": "vm",
        "SLURM_STEP_TASKS_PER_NODE": "2",
    }
    del env[missing]
    with pytest.raises(
        ValueError,
        match=rf"`{missing}`. Received: {missing}=<missing>.*start the program with srun",
    ):
        from_environment(env)


def test_environments_detect_in_order():
    """One interface: TF_CONFIG first (Kubernetes and `tfdist launch` set it), then Slurm."""
    assert [type(e) for e in cluster_lib.ENVIRONMENTS] == [
        cluster_lib.TFConfigEnvironment,
        cluster_lib.SlurmEnvironment,
    ]
    assert all(isinstance(e, cluster_lib.ClusterEnvironment) for e in cluster_lib.ENVIRONMENTS)
    tf_env, slurm_env = cluster_lib.ENVIRONMENTS
    step = dict(SLURM, SLURM_STEP_ID="0")
    detected = [tf_env.detect(env) for env in ({}, {"TF_CONFIG": " "}, {"TF_CONFIG": "{}"})]
    assert detected == [False, False, True]
    assert slurm_env.detect(step) and not slurm_env.detect({})
    assert not slurm_env.detect({"SLURM_JOB_ID": "1", "SLURM_PROCID": "0"})  # 1-task batch script.
    with pytest.raises(ValueError, match=r"`SLURM_STEP_ID`. Received: SLURM_STEP_ID=<missing>"):
        slurm_env.detect(SLURM)  # 7 tasks, but this process is outside srun.
    assert slurm_env.cluster_info(step) == from_slurm(step)
    raw = tf_config(index=1)
    assert tf_env.cluster_info({"TF_CONFIG": raw}) == parse_tf_config(raw)
    with pytest.raises(ValueError, match=r"`TF_CONFIG`. Received: TF_CONFIG=<missing>"):
        tf_env.cluster_info({})


def test_from_slurm_matches_tf_slurm_cluster_resolver(monkeypatch):
    """Where TF's SlurmClusterResolver applies (sorted hosts, GPUs given), it builds our cluster.

    tfdist does not use it (see tfdist/cluster/slurm.py): it imports TF and sorts host names,
    so for `gpu[8-10]` the two differ, as the last assertion shows.
    """
    import tensorflow as tf

    resolver_class = tf.distribute.cluster_resolver.SlurmClusterResolver
    env = {
        "SLURM_JOB_ID": "3",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "3",
        "SLURM_STEP_NUM_TASKS": "5",
        "SLURM_STEP_NODELIST": "node[01-02],node07",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
    }

    def resolve(environ, **kwargs):
        for name, value in environ.items():
            monkeypatch.setenv(name, value)
        resolver = resolver_class(
            port_base=cluster_lib.slurm_port_base(3),
            gpus_per_node=2,
            gpus_per_task=1,
            auto_set_gpu=False,
            **kwargs,
        )
        return resolver.cluster_spec().as_dict(), resolver.get_task_info()

    ours = from_environment(env)
    assert resolve(env) == (ours.cluster, (ours.task_type, ours.task_id))
    roles = dict(env, TFDIST_SLURM_ROLES="chief:1,ps:1,worker:3")
    ours = from_environment(roles)
    assert resolve(roles, jobs={"chief": 1, "ps": 1, "worker": 3}) == (
        ours.cluster,
        (ours.task_type, ours.task_id),
    )
    unpadded = dict(env, SLURM_STEP_NODELIST="gpu[8-10]", SLURM_STEP_TASKS_PER_NODE="2,2,1")
    assert from_environment(unpadded).cluster["worker"][0].startswith("gpu8:")
    assert resolve(unpadded)[0]["worker"][0].startswith("gpu10:")  # TF's sorted() order.


def test_from_slurm_assigns_tasks_to_nodes_in_order():
    info = from_slurm(SLURM, port_base=9000)
    assert info.cluster == {
        "worker": [
            "node01:9000",
            "node01:9001",
            "node02:9000",
            "node02:9001",
            "node10:9000",
            "node10:9001",
            "gpu:9000",
        ]
    }
    assert (info.task_type, info.task_id, info.address) == ("worker", 4, "node10:9000")
    assert from_slurm(dict(SLURM, SLURM_PROCID="0")).is_chief


def test_from_slurm_job_variables_and_even_split():
    env = {
        "SLURM_JOB_ID": "700",
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_JOB_NODELIST": "a,b",
    }
    assert from_slurm(env).cluster == {"worker": ["a:10000", "a:10001", "b:10000", "b:10001"]}


def test_slurm_ports_come_from_the_job_id():
    """Jobs sharing a node get disjoint port blocks below the ephemeral range.

    A requeued job keeps its own block.
    """
    bases = [
        cluster_lib.slurm_port_base(job_id)
        for job_id in range(1000, 1000 + cluster_lib.SLURM_PORT_BLOCKS)
    ]
    blocks = [set(range(b, b + cluster_lib.SLURM_PORTS_PER_JOB)) for b in bases]
    assert len(set().union(*blocks)) == cluster_lib.SLURM_PORTS_PER_JOB * len(blocks)  # No overlap.
    assert min(bases) >= 10000 and max(bases) + cluster_lib.SLURM_PORTS_PER_JOB <= 32768
    env = {
        "SLURM_JOB_ID": "5",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "1",
        "SLURM_STEP_NODELIST": "vm",
        "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_NTASKS": "2",
    }
    assert from_slurm(env).cluster == {"worker": ["127.0.0.1:10160", "127.0.0.1:10161"]}
    other = from_slurm(dict(env, SLURM_JOB_ID="6"))
    assert other.cluster == {"worker": ["127.0.0.1:10192", "127.0.0.1:10193"]}
    with pytest.raises(
        ValueError,
        match=r"`SLURM_STEP_TASKS_PER_NODE`. Received: SLURM_STEP_TASKS_PER_NODE='33'. "
        r"Expected at most 32 tasks per node",
    ):
        from_slurm(dict(env, SLURM_STEP_TASKS_PER_NODE="33", SLURM_NTASKS="33"))


def test_slurm_roles_by_rank():
    env = {
        "SLURM_JOB_ID": "0",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NODELIST": "vm",
        "SLURM_STEP_TASKS_PER_NODE": "4",
        "SLURM_NTASKS": "4",
        "TFDIST_SLURM_ROLES": "chief:1,ps:1,worker:2",
    }
    infos = [from_slurm(dict(env, SLURM_PROCID=str(rank))) for rank in range(4)]
    assert infos[0].cluster == {
        "chief": ["127.0.0.1:10000"],
        "ps": ["127.0.0.1:10001"],
        "worker": ["127.0.0.1:10002", "127.0.0.1:10003"],
    }
    assert [(i.task_type, i.task_id) for i in infos] == [
        ("chief", 0),
        ("ps", 0),
        ("worker", 0),
        ("worker", 1),
    ]
    assert infos[0].is_chief and not infos[2].is_chief


@pytest.mark.parametrize(
    "roles, expected",
    [
        ("chief:1,ps:1,worker:1", "roles for the step's 4 tasks"),
        ("chief:1,boss:1", "roles by rank like"),
        ("ps:1,worker:3", "a chief with ps"),
        ("chief:2,worker:2", "each role once, at most one chief"),
    ],
)
def test_slurm_roles_errors(roles, expected):
    env = {
        "SLURM_JOB_ID": "0",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
        "SLURM_STEP_NODELIST": "vm",
        "SLURM_STEP_TASKS_PER_NODE": "4",
        "SLURM_NTASKS": "4",
        "TFDIST_SLURM_ROLES": roles,
    }
    with pytest.raises(
        ValueError,
        match=rf"`TFDIST_SLURM_ROLES`. Received: TFDIST_SLURM_ROLES='{roles}'. "
        rf"Expected {expected}",
    ):
        from_slurm(env)


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("n1", ["n1"]),
        ("node[01-03,07],other", ["node01", "node02", "node03", "node07", "other"]),
        ("gpu[8-10]", ["gpu8", "gpu9", "gpu10"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("r[1-2]-n[1,3]", ["r1-n1", "r1-n3", "r2-n1", "r2-n3"]),
        ("a[1],b[2-3]x", ["a1", "b2x", "b3x"]),
    ],
)
def test_expand_nodelist(nodelist, hosts):
    assert cluster_lib.expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize(
    "nodelist", ["node[01-03", "node]1[", "node[3-1]", "node[a-b]", "a,,b", "node[]"]
)
def test_expand_nodelist_errors(nodelist):
    with pytest.raises(ValueError, match=r"`SLURM_STEP_NODELIST`. Received: SLURM_STEP_NODELIST="):
        from_slurm(dict(SLURM, SLURM_STEP_NODELIST=nodelist))


def test_expand_tasks_per_node():
    assert cluster_lib.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert cluster_lib.expand_tasks_per_node("4") == [4]


@pytest.mark.parametrize(
    "override, name, received",
    [
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x)"}, "SLURM_STEP_TASKS_PER_NODE", "'2\\(x\\)'"),
        ({"SLURM_STEP_TASKS_PER_NODE": "0,1"}, "SLURM_STEP_TASKS_PER_NODE", "'0,1'"),
        (
            {"SLURM_STEP_TASKS_PER_NODE": "2(x2),1"},
            "SLURM_STEP_TASKS_PER_NODE",
            "'2\\(x2\\),1'.*lists 4 node",
        ),
        ({"SLURM_NTASKS": "8"}, "SLURM_NTASKS", "'8'.*adds up to 7"),
        ({"SLURM_NTASKS": "many"}, "SLURM_NTASKS", "'many'"),
        ({"SLURM_PROCID": "7"}, "SLURM_PROCID", r"'7'.*\[0, 6\]"),
        ({"SLURM_PROCID": "-1"}, "SLURM_PROCID", "'-1'"),
    ],
)
def test_slurm_errors(override, name, received):
    with pytest.raises(ValueError, match=rf"`{name}`. Received: {name}={received}"):
        from_slurm(dict(SLURM, **override))


def test_slurm_uneven_split_needs_tasks_per_node():
    env = {
        "SLURM_JOB_ID": "1",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "3",
        "SLURM_JOB_NODELIST": "a,b",
    }
    with pytest.raises(
        ValueError, match=r"`SLURM_TASKS_PER_NODE`. Received: SLURM_TASKS_PER_NODE=<missing>"
    ):
        from_slurm(env)


def test_slurm_port_base_out_of_range():
    with pytest.raises(ValueError, match=r"`port_base`. Received: port_base=65535"):
        from_slurm(SLURM, port_base=65535)


# --- make_cluster, is_loopback, check_port_free ----------------------------------------------


def test_make_cluster_picks_distinct_free_ports():
    cluster = make_cluster(workers=3, ps=2, chief=True, evaluator=True)
    assert [len(cluster[t]) for t in ("chief", "worker", "ps", "evaluator")] == [1, 3, 2, 1]
    addresses = [a for addrs in cluster.values() for a in addrs]
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    ports = [int(a.rsplit(":", 1)[1]) for a in addresses]
    assert len(set(ports)) == len(ports)
    for i, port in enumerate(ports):
        cluster_lib.check_port_free("127.0.0.1", port, what=f"port{i}")
    assert (
        parse_tf_config({"cluster": cluster, "task": {"type": "ps", "index": 1}}).num_workers == 4
    )


def test_make_cluster_with_ports():
    assert make_cluster(workers=2, ps=1, ports=[5001, 5002, 5003], host="localhost") == {
        "worker": ["localhost:5001", "localhost:5002"],
        "ps": ["localhost:5003"],
    }
    assert make_cluster(workers=1, host="::1", ports=[5001]) == {"worker": ["[::1]:5001"]}


@pytest.mark.parametrize(
    "kwargs, name, received",
    [
        ({"workers": 0}, "workers", "0"),
        ({"workers": "2"}, "workers", "'2'"),
        ({"workers": 1, "ps": -1}, "ps", "-1"),
        ({"workers": 2, "ports": [5001]}, "ports", r"\[5001\].*2 ports"),
        ({"workers": 2, "ports": [5001, 0]}, r"ports\[1\]", "0"),
        ({"workers": 2, "ports": [5001, 5001]}, "ports", r"\[5001, 5001\].*distinct"),
    ],
)
def test_make_cluster_errors(kwargs, name, received):
    with pytest.raises(ValueError, match=rf"`{name}`. Received: {name}={received}"):
        make_cluster(**kwargs)


@pytest.mark.parametrize(
    "host, expected",
    [
        ("localhost", True),
        ("LOCALHOST", True),
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("example.com", False),
        ("::", False),
    ],
)
def test_is_loopback(host, expected):
    assert cluster_lib.is_loopback(host) is expected


def test_check_port_free_raises_on_bound_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(
            ValueError,
            match=(
                r"`TF_CONFIG.cluster.worker\[0\]`. "
                rf"Received: TF_CONFIG.cluster.worker\[0\]='127.0.0.1:{port}'"
                r".*already in use by another process"
            ),
        ):
            cluster_lib.check_port_free("127.0.0.1", port, what="TF_CONFIG.cluster.worker[0]")
