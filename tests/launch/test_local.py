"""Tests for tfdist.launch.local: real subprocesses running tiny Python programs (no TF)."""

import io
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tfdist.launch import local

LOGGER = "tfdist.launch"  # local, supervisor, layout and isolation all log under it.

# Each task program sees its TF_CONFIG task as TYPE and INDEX.
PRELUDE = (
    "import json, os, sys, time\n"
    "TF_CONFIG = json.loads(os.environ['TF_CONFIG'])\n"
    "TYPE, INDEX = TF_CONFIG['task']['type'], TF_CONFIG['task']['index']\n"
)


def py(code):
    return [sys.executable, "-c", PRELUDE + textwrap.dedent(code)]


def run(code, **kwargs):
    out = io.StringIO()
    start = time.monotonic()
    rc = local.launch(py(code), output=out, **kwargs)
    return rc, out.getvalue().splitlines(), time.monotonic() - start


def test_task_env():
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    env = local.task_env(cluster, "worker", 1, {"PATH": "/bin", "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": cluster,
        "task": {"type": "worker", "index": 1},
        "rpc_layer": "grpc",
    }
    assert (
        env["PATH"] == "/bin"
        and env["TF_CPP_MIN_LOG_LEVEL"] == "0"
        and env["PYTHONUNBUFFERED"] == "1"
    )
    assert local.task_env(cluster, "worker", 0, {})["TF_CPP_MIN_LOG_LEVEL"] == "2"
    with pytest.raises(
        ValueError, match=r"`TF_CONFIG.task.index`. Received: TF_CONFIG.task.index=2"
    ):
        local.task_env(cluster, "worker", 2)


def test_two_workers_prefixed_output(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    rc, lines, _ = run("print(json.dumps(TF_CONFIG))", workers=2)
    assert rc == 0
    configs = {}
    for line in lines:
        prefix, _, payload = line.partition("] ")
        configs[prefix + "]"] = json.loads(payload)
    assert sorted(configs) == ["[worker:0]", "[worker:1]"]
    for i in range(2):
        assert configs[f"[worker:{i}]"]["task"] == {"type": "worker", "index": i}
    addresses = configs["[worker:0]"]["cluster"]["worker"]
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    assert len({a.rsplit(":", 1)[1] for a in addresses}) == 2
    assert "Job succeeded" in caplog.text


def test_lines_do_not_interleave_and_stderr_is_merged():
    rc, lines, _ = run(
        """
        for i in range(300):
            print(f"{TYPE}-{INDEX}-line-{i}-" + "x" * 200)
        sys.stderr.write("to stderr")  # No trailing newline.
        """,
        workers=3,
    )
    assert rc == 0
    for i in range(3):
        mine = [line for line in lines if line.startswith(f"[worker:{i}] ")]
        assert mine[:300] == [f"[worker:{i}] worker-{i}-line-{n}-" + "x" * 200 for n in range(300)]
        assert mine[300:] == [f"[worker:{i}] to stderr"]
    assert len(lines) == 3 * 301


def test_failure_stops_the_others(caplog):
    rc, _, elapsed = run("sys.exit(3) if INDEX == 1 else time.sleep(60)", workers=2)
    assert rc == 3
    assert elapsed < 20
    assert "worker:1 exited with code 3" in caplog.text
    assert "worker:0 terminated by launcher (SIGTERM)" in caplog.text
    assert caplog.records[-1].levelno == logging.ERROR


def test_death_by_signal_is_a_failure(caplog):
    rc, _, _ = run("os.kill(os.getpid(), 9) if INDEX == 0 else time.sleep(60)", workers=2)
    assert rc == 1
    assert "worker:0 killed by signal SIGKILL" in caplog.text
    assert "worker:1 terminated by launcher" in caplog.text


def test_parameter_servers_stopped_when_workers_finish(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    rc, lines, elapsed = run(
        """
        if TYPE == "ps":
            print("serving", flush=True)
            while True:
                time.sleep(1)
        if TYPE == "chief":
            time.sleep(1)  # The job ends with the chief: let the workers print first.
        print("done")
        """,
        workers=2,
        ps=1,
        chief=True,
    )
    assert rc == 0
    assert elapsed < 20
    assert sorted(lines) == [
        "[chief:0] done",
        "[ps:0] serving",
        "[worker:0] done",
        "[worker:1] done",
    ] or sorted(lines) == [
        "[chief:0] done",
        "[worker:0] done",
        "[worker:1] done",
    ]  # PS may be stopped first.
    assert "ps:0 terminated by launcher (SIGTERM)" in caplog.text
    assert "chief:0 exited with code 0" in caplog.text


def test_evaluator_must_finish_and_succeed(caplog):
    rc, _, _ = run("sys.exit(5 if TYPE == 'evaluator' else 0)", workers=1, evaluator=True)
    assert rc == 5
    assert "evaluator:0 exited with code 5" in caplog.text


def test_non_loopback_host_needs_allow_external(caplog):
    with pytest.raises(ValueError, match=r"`host`. Received: host='0.0.0.0'.*--allow_external"):
        local.launch(py("pass"), workers=1, host="0.0.0.0")
    # The command exits at once and sends nothing: no traffic leaves loopback.
    rc = local.launch(
        py("pass"), workers=1, host="0.0.0.0", allow_external=True, output=io.StringIO()
    )
    assert rc == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unauthenticated" in warnings[0].getMessage()


def test_timeout_kills_everything(caplog):
    rc, _, elapsed = run("time.sleep(60)", workers=2, ps=1, timeout=1)
    assert rc == local.TIMEOUT_RETURNCODE
    assert elapsed < 10
    assert "exceeded its timeout of 1 s" in caplog.text
    assert (
        "worker:0 terminated by launcher" in caplog.text
        and "ps:0 terminated by launcher" in caplog.text
    )


@pytest.mark.parametrize(
    "kwargs, name, received",
    [
        ({"command": "python train.py"}, "command", "'python train.py'"),
        ({"command": []}, "command", r"\[\]"),
        ({"timeout": 0}, "timeout", "0"),
        ({"workers": 0}, "workers", "0"),
        (
            {"command": ["/nonexistent/tfdist-test-program"]},
            "command",
            r"\['/nonexistent/tfdist-test-program'\]",
        ),
    ],
)
def test_launch_argument_errors(kwargs, name, received):
    kwargs = {"command": py("pass"), "workers": 1, "output": io.StringIO(), **kwargs}
    with pytest.raises(ValueError, match=rf"`{name}`. Received: {name}={received}"):
        local.launch(kwargs.pop("command"), **kwargs)


def test_port_in_use_is_reported():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(
            ValueError, match=rf"`ports\[0\]`. Received: ports\[0\]='127.0.0.1:{port}'.*in use"
        ):
            local.launch(py("pass"), workers=1, ports=[port], output=io.StringIO())


def test_sigterm_is_forwarded_to_tasks():
    """Runs the launcher in its own process, so its signal handlers are installed."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(local.__file__))))
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))
    )
    launcher = textwrap.dedent(f"""
        import sys
        from tfdist.launch import local
        command = {py('print("ready", flush=True); time.sleep(60)')!r}
        sys.exit(local.launch(command, workers=2))
        """)
    proc = subprocess.Popen(
        [sys.executable, "-c", launcher],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        ready = [proc.stdout.readline() for _ in range(2)]
        assert sorted(ready) == ["[worker:0] ready\n", "[worker:1] ready\n"]
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr


# -- restarts ---------------------------------------------------------------
_FLAKY = (
    "import json, os, sys, pathlib\n"
    "task = json.loads(os.environ['TF_CONFIG'])['task']\n"
    "marker = pathlib.Path(sys.argv[1]) / f\"{task['type']}-{task['index']}\"\n"
    "runs = int(marker.read_text()) + 1 if marker.exists() else 1\n"
    "marker.write_text(str(runs))\n"
    "print('run', runs, flush=True)\n"
    "sys.exit(3 if (task['type'], task['index']) == ('worker', 1) and runs == 1 else 0)\n"
)


def test_group_restart_without_ps(tmp_path, caplog):
    out = io.StringIO()
    # worker:1 fails only once worker:0 has counted its first run: otherwise the launcher may
    # stop worker:0 before it counts, and its restart would count as its first run.
    flaky = _FLAKY.replace(
        "sys.exit(3 if",
        "import time\nfirst = marker.parent / 'worker-0'\n"
        "while runs == 1 and task['index'] == 1 and not (first.exists() and first.read_text()):\n"
        "    time.sleep(0.01)\nsys.exit(3 if",
    )
    rc = local.launch(
        [sys.executable, "-c", flaky, str(tmp_path)], workers=2, max_restarts=1, output=out
    )
    assert rc == 0, out.getvalue()
    # The whole group ran twice: a collective cannot lose a member.
    assert (tmp_path / "worker-0").read_text() == "2" and (tmp_path / "worker-1").read_text() == "2"
    assert "restarting the whole group (restart 1 of 1)" in caplog.text


def test_ps_restarts_only_the_failed_worker(tmp_path, caplog):
    out = io.StringIO()
    chief = _FLAKY.replace(
        "sys.exit(", "import time; time.sleep(1.5 if task['type'] == 'chief' else 0); sys.exit("
    )
    ps_sleeps = chief.replace(
        "sys.exit(3", "time.sleep(60 if task['type'] == 'ps' else 0); sys.exit(3"
    )
    rc = local.launch(
        [sys.executable, "-c", ps_sleeps, str(tmp_path)],
        workers=2,
        ps=1,
        chief=True,
        max_restarts=2,
        output=out,
    )
    assert rc == 0, out.getvalue()
    assert (tmp_path / "worker-1").read_text() == "2"
    assert (tmp_path / "worker-0").read_text() == "1" and (tmp_path / "chief-0").read_text() == "1"
    assert "restarting worker:1 alone (restart 1 of 2)" in caplog.text


def test_restarts_exhausted(tmp_path, caplog):
    always_fails = [sys.executable, "-c", "import sys; sys.exit(5)"]
    rc = local.launch(always_fails, workers=2, max_restarts=2, output=io.StringIO())
    assert rc == 5
    assert "after 2 of 2 restarts" in caplog.text


def test_max_restarts_must_be_non_negative():
    with pytest.raises(ValueError, match="argument `max_restarts`. Received: max_restarts=-1"):
        local.launch([sys.executable, "-c", "pass"], workers=1, max_restarts=-1)


# -- several nodes (--nnodes, --node_rank, --hosts) ---------------------------
def test_node_cluster_two_nodes_workers_only():
    hosts = ["h1:2222", "h2:3000"]
    expected = {"worker": ["h1:2222", "h1:2223", "h2:3000", "h2:3001"]}
    assert local.node_cluster(2, 0, hosts, workers=2) == (
        expected,
        [local.Task("worker", 0), local.Task("worker", 1)],
    )
    assert local.node_cluster(2, 1, "h1:2222, h2:3000", workers=2) == (
        expected,
        [local.Task("worker", 2), local.Task("worker", 3)],
    )


def test_node_cluster_layout_with_ps_chief_and_evaluator():
    hosts = ["h1:2222", "[fd00::2]:2222"]
    cluster0, tasks0 = local.node_cluster(2, 0, hosts, workers=2, ps=1, chief=True, evaluator=True)
    cluster1, tasks1 = local.node_cluster(2, 1, hosts, workers=2, ps=1, chief=True, evaluator=True)
    assert (
        cluster0
        == cluster1
        == {
            "chief": ["h1:2225"],  # Node 0, after its workers and ps.
            "worker": [
                "h1:2222",
                "h1:2223",
                "[fd00::2]:2222",
                "[fd00::2]:2223",
            ],  # Node k: ids k*2, k*2+1.
            "ps": ["h1:2224", "[fd00::2]:2224"],  # One per node.
            "evaluator": ["h1:2226"],
        }
    )
    assert [str(t) for t in tasks0] == ["chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0"]
    assert [str(t) for t in tasks1] == ["worker:2", "worker:3", "ps:1"]
    # Every local task's TF_CONFIG is valid and puts it on its own node.
    for task in tasks1:
        config = json.loads(local.task_env(cluster1, task.task_type, task.task_id, {})["TF_CONFIG"])
        assert config["cluster"] == cluster1
        assert config["task"] == {"type": task.task_type, "index": task.task_id}
        assert cluster1[task.task_type][task.task_id].startswith("[fd00::2]:")


@pytest.mark.parametrize(
    "args, kwargs, name, received",
    [
        ((0, 0, "a:1"), {}, "nnodes", "0"),
        ((2, 2, "a:1,b:1"), {}, "node_rank", r"2. Expected an integer in the range \[0, 1\]"),
        ((2, -1, "a:1,b:1"), {}, "node_rank", "-1"),
        ((2, 0, "a:1"), {}, "hosts", r"'a:1'. Expected 2 'host:port' entries"),
        ((1, 0, ["a:1", "b:1"]), {}, "hosts", r"\['a:1', 'b:1'\]. Expected 1 'host:port'"),
        ((2, 0, None), {}, "hosts", "None"),
        ((2, 0, "a:1,b"), {}, r"hosts\[1\]", "'b'. Expected a 'host:port' string"),
        ((2, 0, "a:1,b:0"), {}, r"hosts\[1\]", "'b:0'"),
        ((2, 0, "a:1,[::1:2"), {}, r"hosts\[1\]", r"'\[::1:2'"),
        (
            (2, 0, "a:1,A:1"),
            {},
            r"hosts\[1\]",
            "'A:1'. Expected a 'host:port' that no other node uses. hosts\\[0\\]",
        ),
        (
            (2, 0, "a:1,a:2"),
            {"workers": 2},
            "hosts",
            r"\['a:1', 'a:2'\]. Expected nodes whose port ranges do not overlap",
        ),
        (
            (1, 0, "a:65535"),
            {"workers": 2},
            r"hosts\[0\]",
            "'a:65535'. Expected a base port <= 65534",
        ),
        ((1, 0, "a:1"), {"workers": 0}, "workers", "0"),
        ((1, 0, "a:1"), {"ps": -1}, "ps", "-1"),
    ],
)
def test_node_cluster_errors(args, kwargs, name, received):
    kwargs = {"workers": 1, **kwargs}
    with pytest.raises(ValueError, match=rf"argument `{name}`. Received: {name}={received}"):
        local.node_cluster(*args, **kwargs)


def free_port_range(n):
    """A base port with n free consecutive loopback ports."""
    import socket

    import portpicker

    for _ in range(100):
        base = portpicker.pick_unused_port()
        if base + n > 65535:
            continue
        try:
            for port in range(base, base + n):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    pytest.skip(f"no {n} consecutive free ports")


def test_two_nodes_on_one_machine(tmp_path):
    """Two launchers (node_rank 0 and 1) agree on one cluster and each runs only its own tasks."""
    base = free_port_range(7)  # Node 0: 2 workers, 1 ps, the chief; node 1: 2 workers, 1 ps.
    hosts = f"127.0.0.1:{base},127.0.0.1:{base + 4}"
    # Each task saves its TF_CONFIG. In a PS job the launcher stops the other tasks once the
    # chief (or, without one, the workers) exit, so those wait until every task of their node
    # has saved.
    code = """
        out = sys.argv[1]
        with open(os.path.join(out, f"{TYPE}-{INDEX}.json"), "w") as f:
            json.dump(TF_CONFIG, f)
        deadline = time.time() + 20
        while TYPE != "ps" and len(os.listdir(out)) < int(sys.argv[2]) and time.time() < deadline:
            time.sleep(0.02)
        """
    for rank, num_tasks in ((0, 4), (1, 3)):
        out = tmp_path / f"node{rank}"
        out.mkdir()
        rc = local.launch(
            py(code) + [str(out), str(num_tasks)],
            nnodes=2,
            node_rank=rank,
            hosts=hosts,
            workers=2,
            ps=1,
            chief=True,
            output=io.StringIO(),
        )
        assert rc == 0
    saved = {
        (p.parent.name, p.stem): json.loads(p.read_text()) for p in tmp_path.glob("node*/*.json")
    }
    assert sorted(saved) == sorted(
        [
            ("node0", "chief-0"),
            ("node0", "worker-0"),
            ("node0", "worker-1"),
            ("node0", "ps-0"),
            ("node1", "worker-2"),
            ("node1", "worker-3"),
            ("node1", "ps-1"),
        ]
    )
    expected = {
        "chief": [f"127.0.0.1:{base + 3}"],
        "worker": [f"127.0.0.1:{base + i}" for i in (0, 1, 4, 5)],
        "ps": [f"127.0.0.1:{base + 2}", f"127.0.0.1:{base + 6}"],
    }
    for (_, name), config in saved.items():
        assert config["cluster"] == expected
        assert f"{config['task']['type']}-{config['task']['index']}" == name


def test_external_hosts_need_allow_external(caplog):
    base = free_port_range(1)
    hosts = f"203.0.113.7:{base},127.0.0.1:{base}"  # 203.0.113.0/24 is TEST-NET-3: never routed.
    with pytest.raises(
        ValueError,
        match=(
            r"argument `hosts`. Received: hosts=\['203.0.113.7:\d+', '127.0.0.1:\d+'\]"
            r".*Not loopback: 203.0.113.7:\d+\. .*no authentication.*--allow_external"
        ),
    ):
        local.launch(
            py("pass"), nnodes=2, node_rank=1, hosts=hosts, workers=1, output=io.StringIO()
        )
    # This node is the loopback one and its task exits at once: nothing is sent to 203.0.113.7.
    out = io.StringIO()
    rc = local.launch(
        py("print(json.dumps(TF_CONFIG))"),
        nnodes=2,
        node_rank=1,
        hosts=hosts,
        workers=1,
        allow_external=True,
        output=out,
    )
    assert rc == 0
    assert json.loads(out.getvalue().partition("] ")[2])["cluster"] == {
        "worker": [f"203.0.113.7:{base}", f"127.0.0.1:{base}"]
    }
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "203.0.113.7" in warnings[0] and "unauthenticated" in warnings[0]


@pytest.mark.parametrize(
    "kwargs, name, received",
    [
        ({"nnodes": 2}, "hosts", "None"),
        ({"node_rank": 1}, "node_rank", r"1. Expected an integer in the range \[0, 0\]"),
        ({"nnodes": 2, "node_rank": 2, "hosts": "127.0.0.1:1,127.0.0.1:2"}, "node_rank", "2"),
        (
            {"hosts": "127.0.0.1:2000", "ports": [2000]},
            "ports",
            r"\[2000\]. Expected None when hosts is given",
        ),
        ({"hosts": "127.0.0.1:2000", "host": "localhost"}, "host", "'localhost'"),
    ],
)
def test_launch_node_argument_errors(kwargs, name, received):
    with pytest.raises(ValueError, match=rf"`{name}`. Received: {name}={received}"):
        local.launch(py("pass"), workers=1, output=io.StringIO(), **kwargs)


def test_node_port_in_use_is_reported():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(
            ValueError,
            match=(
                rf"`TF_CONFIG.cluster.worker\[1\]`. Received: "
                rf"TF_CONFIG.cluster.worker\[1\]='127.0.0.1:{port}'.*in use"
            ),
        ):
            local.launch(
                py("pass"),
                nnodes=2,
                node_rank=1,
                hosts=f"127.0.0.1:{port - 1},127.0.0.1:{port}",
                workers=1,
                output=io.StringIO(),
            )
