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

LOGGER = "tfdist.launch.local"

# Each task program sees its TF_CONFIG task as TYPE and INDEX.
PRELUDE = ("import json, os, sys, time\n"
           "TF_CONFIG = json.loads(os.environ['TF_CONFIG'])\n"
           "TYPE, INDEX = TF_CONFIG['task']['type'], TF_CONFIG['task']['index']\n")


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
    assert json.loads(env["TF_CONFIG"]) == {"cluster": cluster, "task": {"type": "worker", "index": 1},
                                            "rpc_layer": "grpc"}
    assert env["PATH"] == "/bin" and env["TF_CPP_MIN_LOG_LEVEL"] == "0" and env["PYTHONUNBUFFERED"] == "1"
    assert local.task_env(cluster, "worker", 0, {})["TF_CPP_MIN_LOG_LEVEL"] == "2"
    with pytest.raises(ValueError, match=r"`TF_CONFIG.task.index`. Received: TF_CONFIG.task.index=2"):
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
    rc, lines, _ = run("""
        for i in range(300):
            print(f"{TYPE}-{INDEX}-line-{i}-" + "x" * 200)
        sys.stderr.write("to stderr")  # No trailing newline.
        """, workers=3)
    assert rc == 0
    for i in range(3):
        mine = [l for l in lines if l.startswith(f"[worker:{i}] ")]
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
    rc, lines, elapsed = run("""
        if TYPE == "ps":
            print("serving", flush=True)
            while True:
                time.sleep(1)
        print("done")
        """, workers=2, ps=1, chief=True)
    assert rc == 0
    assert elapsed < 20
    assert sorted(lines) == ["[chief:0] done", "[ps:0] serving", "[worker:0] done", "[worker:1] done"] or \
        sorted(lines) == ["[chief:0] done", "[worker:0] done", "[worker:1] done"]  # PS may be stopped first.
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
    rc = local.launch(py("pass"), workers=1, host="0.0.0.0", allow_external=True, output=io.StringIO())
    assert rc == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unauthenticated" in warnings[0].getMessage()


def test_timeout_kills_everything(caplog):
    rc, _, elapsed = run("time.sleep(60)", workers=2, ps=1, timeout=1)
    assert rc == local.TIMEOUT_RETURNCODE
    assert elapsed < 10
    assert "exceeded its timeout of 1 s" in caplog.text
    assert "worker:0 terminated by launcher" in caplog.text and "ps:0 terminated by launcher" in caplog.text


@pytest.mark.parametrize("kwargs, name, received", [
    ({"command": "python train.py"}, "command", "'python train.py'"),
    ({"command": []}, "command", r"\[\]"),
    ({"timeout": 0}, "timeout", "0"),
    ({"workers": 0}, "workers", "0"),
    ({"command": ["/nonexistent/tfdist-test-program"]}, "command", r"\['/nonexistent/tfdist-test-program'\]"),
])
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
        with pytest.raises(ValueError, match=rf"`ports\[0\]`. Received: ports\[0\]='127.0.0.1:{port}'.*in use"):
            local.launch(py("pass"), workers=1, ports=[port], output=io.StringIO())


def test_sigterm_is_forwarded_to_tasks():
    """Runs the launcher in its own process, so its signal handlers are installed."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(local.__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))
    launcher = textwrap.dedent(f"""
        import sys
        from tfdist.launch import local
        command = {py('print("ready", flush=True); time.sleep(60)')!r}
        sys.exit(local.launch(command, workers=2))
        """)
    proc = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
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
    rc = local.launch([sys.executable, "-c", _FLAKY, str(tmp_path)], workers=2, max_restarts=1, output=out)
    assert rc == 0, out.getvalue()
    # The whole group ran twice: a collective cannot lose a member.
    assert (tmp_path / "worker-0").read_text() == "2" and (tmp_path / "worker-1").read_text() == "2"
    assert "restarting the whole group (restart 1 of 1)" in caplog.text


def test_ps_restarts_only_the_failed_worker(tmp_path, caplog):
    out = io.StringIO()
    chief = _FLAKY.replace("sys.exit(", "import time; time.sleep(1.5 if task['type'] == 'chief' else 0); sys.exit(")
    ps_sleeps = chief.replace("sys.exit(3", "time.sleep(60 if task['type'] == 'ps' else 0); sys.exit(3")
    rc = local.launch([sys.executable, "-c", ps_sleeps, str(tmp_path)], workers=2, ps=1, chief=True, max_restarts=2,
                output=out)
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
