"""``TFDIST_PRELOAD_SERVER``: launches fork their preloaded Python from one shared by all of them.

A real shared interpreter (``python -m tfdist.launch.preload SOCKET MODULE``, a standard-library
module standing in for TensorFlow) and real launches: their tasks must run in their own
launch's private network and PID namespaces, with the module imported, as without it.
"""

import io
import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import run_tfdist
from tfdist.launch import local
from tfdist.launch.preload import READY, SHARED_SERVER_ENV

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks need Linux"),
]
MODULE = "email.mime.text"  # Imported by no task on its own.
_REPORT = textwrap.dedent(f"""
    import json, os, sys
    print(json.dumps({{
        "preloaded": {MODULE!r} in sys.modules,
        "task": json.loads(os.environ["TF_CONFIG"])["task"]["index"],
        "net": os.readlink("/proc/self/ns/net"), "pid_ns": os.readlink("/proc/self/ns/pid"),
        "pid": os.getpid(), "ppid": os.getppid()}}))
""")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("shared") / "zygote.sock")
    env = {k: v for k, v in os.environ.items() if k != SHARED_SERVER_ENV}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"  # As the launches below have it (run_tfdist sets it too).
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfdist.launch.preload", path, MODULE],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == READY
    yield {"path": path, "pid": proc.pid}
    proc.kill()
    proc.wait()


def _reports(text):
    lines = [line.split("] ", 1) for line in text.splitlines() if line.startswith("[worker:")]
    return [json.loads(body) for _, body in lines if body.startswith("{")]


def _children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return f.read().split()


def test_each_launch_forks_its_preloaded_python_from_the_shared_one_into_its_namespaces(
    server, monkeypatch, caplog
):
    caplog.set_level(logging.INFO, logger="tfdist.launch")
    monkeypatch.setenv(SHARED_SERVER_ENV, server["path"])
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    seen = []
    for _ in range(2):  # Two launches in turn, from the one shared Python.
        out = io.StringIO()
        assert (
            local.launch([sys.executable, "-c", _REPORT], workers=2, output=out, preload=[MODULE])
            == 0
        )
        seen.append(_reports(out.getvalue()))
    assert caplog.text.count(f"(forked from the shared one at {server['path']})") == 2
    host_net, host_pid = os.readlink("/proc/self/ns/net"), os.readlink("/proc/self/ns/pid")
    for reports in seen:
        assert sorted(r["task"] for r in reports) == [0, 1]
        assert all(r["preloaded"] for r in reports)
        # One private network and one PID namespace per launch, shared by its two tasks.
        assert len({r["net"] for r in reports}) == len({r["pid_ns"] for r in reports}) == 1
        assert reports[0]["net"] != host_net and reports[0]["pid_ns"] != host_pid
        # Their parent, the launch's preloaded Python, is outside the PID namespace (pid 0 there):
        # it was forked by the shared one, which runs outside every launch.
        assert all(r["ppid"] == 0 and r["pid"] < 10 for r in reports)
    assert _children(server["pid"]) == []  # Each launch's own preloaded Python ended with it.
    # The command-line launcher reads the variable too.
    proc = run_tfdist(
        "launch",
        "--workers=1",
        f"--preload={MODULE}",
        "--",
        sys.executable,
        "-c",
        _REPORT,
        timeout=120,
    )
    assert proc.returncode == 0 and "forked from the shared one" in proc.stdout, proc.stdout
    assert _reports(proc.stdout)[0]["ppid"] == 0


@pytest.mark.parametrize(
    "change, why",
    [
        ({"TF_CPP_MIN_LOG_LEVEL": "0"}, "the tasks' environment differs in TF_CPP_MIN_LOG_LEVEL"),
        ({SHARED_SERVER_ENV: "/nonexistent/zygote.sock"}, "names no running preloaded interpreter"),
        ({SHARED_SERVER_ENV: "ended"}, "has ended)"),
    ],
)
def test_a_shared_python_that_would_differ_is_not_used_and_the_launch_says_why(
    server, monkeypatch, caplog, change, why, tmp_path
):
    caplog.set_level(logging.INFO, logger="tfdist.launch")
    if change.get(SHARED_SERVER_ENV) == "ended":  # What a killed one leaves: its files, no process.
        ended = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"],
            text=True,
            capture_output=True,
            check=True,
        )
        with open(server["path"] + ".json") as f:
            described = {**json.load(f), "pid": int(ended.stdout)}
        (tmp_path / "z.sock.json").write_text(json.dumps(described))
        change = {SHARED_SERVER_ENV: str(tmp_path / "z.sock")}
    monkeypatch.setenv(SHARED_SERVER_ENV, server["path"])
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    for key, value in change.items():
        monkeypatch.setenv(key, value)
    out = io.StringIO()
    assert (
        local.launch([sys.executable, "-c", _REPORT], workers=1, output=out, preload=[MODULE]) == 0
    )
    assert "Not forking from the shared preloaded interpreter: " in caplog.text
    assert why in caplog.text
    (report,) = _reports(out.getvalue())
    assert report["preloaded"] and report["ppid"] != 0  # Its own preloaded Python, as before.
    # Modules it did not import: the same.
    caplog.clear()
    monkeypatch.setenv(SHARED_SERVER_ENV, server["path"])
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    assert (
        local.launch(
            [sys.executable, "-c", "pass"], workers=1, output=io.StringIO(), preload=["json"]
        )
        == 0
    )
    assert "it imported ['email.mime.text'], not all of ['json']" in caplog.text


@pytest.mark.parametrize(
    "args, expected",
    [([], "Received: []"), (["/tmp/x.sock", "tensor flow"], "Not module names: ['tensor flow']")],
)
def test_the_shared_python_refuses_bad_arguments_with_its_usage(args, expected):
    proc = subprocess.run(
        [sys.executable, "-m", "tfdist.launch.preload", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and proc.stderr.startswith("usage: python -m tfdist.launch.preload")
    assert expected in proc.stderr


def test_the_suite_shares_one_only_where_it_runs_a_multi_process_test(monkeypatch):
    from tests import shared_preload

    class Config:
        def __init__(self, worker=True, **options):
            if worker:
                self.workerinput = {}
            self.options = options

        def getoption(self, name, default=None):
            return self.options.get(name, default)

    class Item:
        def __init__(self, *marks):
            self.marks = marks

        def get_closest_marker(self, name):
            return name if name in self.marks else None

    in_process, launching = Item(), Item("multiprocess", "slow")
    monkeypatch.delenv("TFDIST_TEST_SHARED_PRELOAD", raising=False)
    assert shared_preload.wanted(Config(), [in_process, launching])
    assert not shared_preload.wanted(Config(), [in_process])  # e.g. `pytest tests/data`
    assert not shared_preload.wanted(Config(collectonly=True), [launching])
    assert not shared_preload.wanted(Config(worker=False, numprocesses=2), [launching])  # xdist's
    monkeypatch.setenv("TFDIST_TEST_SHARED_PRELOAD", "0")
    assert not shared_preload.wanted(Config(), [launching])
