"""What a local launch exposes and what outlives it: the host's socket table, a launcher killed -9.

Nothing here sends traffic off loopback: the tasks talk over the loopback of a
network namespace the launch creates, and the test only reads socket tables.
"""

import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

from tfdist.launch import isolation, local

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sandbox_or_skip(private_network=True):
    with isolation.Sandbox(private_network=private_network) as sandbox:
        if (private_network and not sandbox.private_network) or not sandbox.pid_namespace:
            problem = sandbox.network_problem or sandbox.pid_problem
            pytest.skip(f"namespaces are not permitted here: {problem}")


def _without_cap_sys_admin():
    """A command prefix that runs a program as root without CAP_SYS_ADMIN: no namespaces at all."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv(1) to drop CAP_SYS_ADMIN")
    return [setpriv, "--bounding-set=-sys_admin", "--inh-caps=-sys_admin"]


def _listening_ports():
    """Local (address, port) of every listening TCP socket in *this* (the host's) net namespace."""
    out = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout
    sockets = []
    for line in out.splitlines():
        address, _, port = line.split()[3].rpartition(":")
        sockets.append((address, int(port)))
    return sockets


# Each worker joins a real MultiWorkerMirroredStrategy (TF gRPC servers), all-reduces over
# loopback, reports its server's socket as seen inside its namespace, then waits until the
# test has read the host's table.
_MWMS_TASK = textwrap.dedent("""
    import json, os, pathlib, subprocess, sys, time
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    config = json.loads(os.environ["TF_CONFIG"])
    index = config["task"]["index"]
    port = config["cluster"]["worker"][index].rpartition(":")[2]

    @tf.function
    def step():
        return tf.distribute.get_replica_context().all_reduce("sum", tf.constant(index + 1.0))

    total = strategy.experimental_local_results(strategy.run(step))[0]
    ss = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True)
    inside = ss.stdout.split()
    report = {"total": float(total), "inside": inside[3] if len(inside) > 3 else None}
    print(json.dumps(report), flush=True)
    out = pathlib.Path(sys.argv[1])
    (out / f"ready-{index}").touch()
    deadline = time.time() + 120
    while not (out / "done").exists() and time.time() < deadline:
        time.sleep(0.05)
    """)


@pytest.mark.multiprocess
def test_task_ports_are_absent_from_the_host_socket_table(tmp_path):
    _sandbox_or_skip()
    out = io.StringIO()
    result = {}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    launcher = threading.Thread(
        target=lambda: result.update(
            rc=local.launch(
                [sys.executable, "-c", _MWMS_TASK, str(tmp_path)],
                workers=2,
                env=env,
                output=out,
                timeout=240,
            )
        )
    )
    launcher.start()
    try:
        deadline = time.monotonic() + 240
        while not all((tmp_path / f"ready-{i}").exists() for i in range(2)):
            assert launcher.is_alive() and time.monotonic() < deadline, out.getvalue()[-3000:]
            time.sleep(0.1)
        host_sockets = _listening_ports()
    finally:
        (tmp_path / "done").touch()
        launcher.join(timeout=60)
    assert result.get("rc") == 0, out.getvalue()[-3000:]
    reports = {}
    for line in out.getvalue().splitlines():
        prefix, _, payload = line.partition("] ")
        if payload.startswith("{"):
            reports[prefix + "]"] = json.loads(payload)
    assert sorted(reports) == ["[worker:0]", "[worker:1]"], out.getvalue()[-3000:]
    ports = {int(r["inside"].rpartition(":")[2]) for r in reports.values()}
    for report in reports.values():
        assert (
            report["total"] == 3.0
        )  # 1 + 2: the all-reduce crossed both processes, over loopback.
        # Inside its namespace TF's server listens on every interface (*:PORT), as on a host...
        assert report["inside"].rpartition(":")[0] in ("*", "0.0.0.0", "[::]"), report
    # ...but that namespace has only loopback: the host's table does not list the ports at all.
    assert not [s for s in host_sockets if s[1] in ports], host_sockets


def test_without_a_private_network_the_launcher_warns_and_names_a_firewall_rule(caplog):
    rc = local.launch(
        [sys.executable, "-c", "pass"], workers=2, private_network=False, output=io.StringIO()
    )
    assert rc == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "private_network=False" in warnings[0] and "other hosts can reach them" in warnings[0]
    assert (
        "unauthenticated" in warnings[0]
        and "iptables -I INPUT ! -i lo -p tcp -m multiport --dports" in warnings[0]
    )


def test_private_network_is_the_default_and_says_so(caplog):
    _sandbox_or_skip()
    caplog.set_level(logging.INFO, logger="tfdist.launch")
    out = io.StringIO()
    code = "import socket; print(sorted({name for _, name in socket.if_nameindex()}))"
    assert local.launch([sys.executable, "-c", code], workers=1, output=out) == 0
    assert out.getvalue() == "[worker:0] ['lo']\n"  # The task sees no interface but loopback.
    assert "private network namespace that has only loopback" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def _processes_with(marker):
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found[int(pid)] = cmdline
    return found


@pytest.mark.fault
@pytest.mark.parametrize("namespaces", [True, False], ids=["namespaces", "no_namespaces"])
def test_no_task_outlives_a_launcher_killed_with_sigkill(tmp_path, namespaces):
    if namespaces:
        _sandbox_or_skip()
    prefix = [] if namespaces else _without_cap_sys_admin()
    marker = f"tfdist-orphan-test-{uuid.uuid4().hex}"
    # Each task starts a child in its process group and (with namespaces) a grandchild in a
    # session of its own, out of reach of killpg; then it waits. Every one of them carries the
    # marker in its command line.
    sleeper = [sys.executable, "-c", "import time; time.sleep(300)", marker]
    task = textwrap.dedent(f"""
        import subprocess, time
        subprocess.Popen({sleeper!r})
        if {namespaces!r}:
            subprocess.Popen({sleeper!r}, start_new_session=True)
        print("ready", flush=True)
        time.sleep(300)
        """)
    launcher_code = textwrap.dedent(f"""
        import sys
        from tfdist.launch import local
        sys.exit(local.launch([sys.executable, "-c", {task!r}, {marker!r}], workers=2, ps=1))
        """)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    )
    with open(tmp_path / "stderr", "w") as stderr:
        launcher = subprocess.Popen(
            [*prefix, sys.executable, "-c", launcher_code],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
    try:
        ready = [launcher.stdout.readline() for _ in range(3)]
        assert sorted(ready) == ["[ps:0] ready\n", "[worker:0] ready\n", "[worker:1] ready\n"]
        time.sleep(0.5)  # Let the sleepers exec.
        started = {p: c for p, c in _processes_with(marker).items() if p != launcher.pid}
        # Per task: its sandbox helper, the task, a child, and with namespaces a grandchild.
        assert len(started) == 3 * (4 if namespaces else 3), started
        assert _processes_with(
            f"--ppid={launcher.pid}"
        )  # The sandbox helpers (and namespace holder).
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 15
        while (
            _processes_with(marker) or _processes_with(f"--ppid={launcher.pid}")
        ) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes_with(marker) == {}
        assert _processes_with(f"--ppid={launcher.pid}") == {}
    finally:
        launcher.kill()
        for pid in _processes_with(marker):  # Only if the test failed: clean up what it started.
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    warnings = (tmp_path / "stderr").read_text()
    if namespaces:
        assert warnings == ""
    else:  # Where no namespace can be made, the launcher says so and names the firewall rule.
        assert (
            "No private network namespace for the tasks "
            "(unshare(CLONE_NEWNET): Operation not permitted)" in warnings
        )
        assert "iptables -I INPUT ! -i lo -p tcp -m multiport --dports" in warnings
        assert "No PID namespace for the tasks" in warnings
