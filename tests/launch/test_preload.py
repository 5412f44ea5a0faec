"""``tfdist launch --preload``: tasks forked from one interpreter that imported the modules first.

Real launches of tiny Python commands (a standard-library module stands in for
TensorFlow, so that these stay cheap); the fault, parity and multi-worker modules
run their TensorFlow jobs with ``--preload=tensorflow,keras``.
"""

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

from tests.helpers import REPO, run_tfdist
from tfdist.launch import local
from tfdist.launch.preload import check_preload, is_python_command

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks need Linux"),
]
MODULE = "email.mime.text"  # Imported by no task on its own.
_REPORT = textwrap.dedent(f"""
    import json, os, sys
    preloaded = {MODULE!r} in sys.modules
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    print(json.dumps({{"preloaded": preloaded, "task": task, "argv": sys.argv,
                      "name": __name__, "cwd": os.getcwd(), "path0": sys.path[0],
                      "cpus": sorted(os.sched_getaffinity(0)), "pid": os.getpid(),
                      "sid": os.getsid(0)}}))
""")


def _reports(text):
    return {
        line.split("] ", 1)[0][1:]: json.loads(line.split("] ", 1)[1])
        for line in text.splitlines()
        if line.startswith("[worker:") and line.split("] ", 1)[1].startswith("{")
    }


def test_each_task_starts_with_the_modules_imported_in_its_own_session(tmp_path):
    out = io.StringIO()
    rc = local.launch([sys.executable, "-c", _REPORT, "x"], workers=2, output=out, preload=[MODULE])
    assert rc == 0, out.getvalue()
    reports = _reports(out.getvalue())
    assert set(reports) == {"worker:0", "worker:1"}
    for k in range(2):
        report = reports[f"worker:{k}"]
        assert report["preloaded"] and report["task"] == {"type": "worker", "index": k}
        assert report["argv"] == ["-c", "x"] and report["name"] == "__main__"
        assert report["cwd"] == os.getcwd() and report["path0"] == ""
        assert report["sid"] == report["pid"]  # a session (process group) of its own
    if len(os.sched_getaffinity(0)) >= 2:  # pinned as without preload: a core each
        assert not set(reports["worker:0"]["cpus"]) & set(reports["worker:1"]["cpus"])


def test_scripts_and_modules_run_as_main_with_their_arguments(tmp_path):
    (tmp_path / "job.py").write_text(_REPORT)
    out = io.StringIO()
    rc = local.launch(
        [sys.executable, str(tmp_path / "job.py"), "a b"], workers=1, output=out, preload=[MODULE]
    )
    assert rc == 0, out.getvalue()
    report = _reports(out.getvalue())["worker:0"]
    assert report["argv"] == [str(tmp_path / "job.py"), "a b"] and report["preloaded"]
    assert report["name"] == "__main__" and report["path0"] == str(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = io.StringIO()
    rc = local.launch(
        [sys.executable, "-m", "job", "--flag"], workers=1, output=out, env=env, preload=[MODULE]
    )
    assert rc == 0, out.getvalue()
    report = _reports(out.getvalue())["worker:0"]
    assert report["argv"] == [str(tmp_path / "job.py"), "--flag"] and report["name"] == "__main__"


def test_exit_codes_and_deaths_by_signal_are_the_tasks_own_and_restarts_fork_again(
    tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="tfdist.launch")
    # worker:1 kills itself with SIGKILL on its first run; the group restarts, from the same
    # preloaded interpreter, and the second run succeeds.
    code = textwrap.dedent(f"""
        import json, os, pathlib, signal, sys
        assert {MODULE!r} in sys.modules
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        pathlib.Path(sys.argv[1]).mkdir(exist_ok=True)
        marker = pathlib.Path(sys.argv[1]) / f"worker-{{task['index']}}"
        first = not marker.exists()
        marker.write_text("ran")
        if task["index"] == 1 and first:
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(0 if task["index"] == 1 else int(sys.argv[2]))
    """)
    out = io.StringIO()
    rc = local.launch(
        [sys.executable, "-c", code, str(tmp_path / "a"), "0"],
        workers=2,
        output=out,
        max_restarts=1,
        preload=[MODULE],
    )
    assert rc == 0, out.getvalue()
    assert "worker:1 killed by signal SIGKILL; restarting the whole group" in caplog.text
    # Without restarts the launcher reports the death by its signal, as without preload.
    proc = run_tfdist(
        "launch",
        "--workers=2",
        f"--preload={MODULE}",
        "--",
        sys.executable,
        "-c",
        code,
        str(tmp_path / "b"),
        "0",
        timeout=120,
    )
    assert proc.returncode == 1 and "worker:1 killed by signal SIGKILL" in proc.stdout, proc.stdout
    # worker:1 has run before (its marker exists), so it exits 0 and worker:0's code 3 is the job's.
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "worker-1").write_text("ran")
    out = io.StringIO()
    rc = local.launch(
        [sys.executable, "-c", code, str(tmp_path / "c"), "3"],
        workers=2,
        output=out,
        preload=[MODULE],
    )
    assert rc == 3, out.getvalue()


def test_the_launchers_sigterm_reaches_the_preloaded_task(tmp_path):
    # SIGTERM to the launcher goes on to every task: the task's own handler runs and exits 75;
    # the launcher, stopped by SIGTERM, exits 143.
    code = textwrap.dedent("""
        import pathlib, signal, sys, time
        def stop(signum, frame):
            pathlib.Path(sys.argv[1], "got-sigterm").write_text("yes")
            sys.exit(75)
        signal.signal(signal.SIGTERM, stop)
        pathlib.Path(sys.argv[1], "ready").write_text("yes")
        time.sleep(60)
    """)
    command = [sys.executable, "-m", "tfdist", "launch", "--workers=1", f"--preload={MODULE}"]
    env = {**os.environ, "PYTHONPATH": REPO}
    with subprocess.Popen(
        [*command, "--", sys.executable, "-c", code, str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as launcher:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        launcher.send_signal(signal.SIGTERM)
        out, _ = launcher.communicate(timeout=60)
    assert (tmp_path / "got-sigterm").read_text() == "yes", out
    assert launcher.returncode == 143 and "worker:0 terminated by launcher (exit code 75)" in out


def test_bad_preloads_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match=r"argument `preload`.*PYTHON -m MODULE"):
        check_preload(["tensorflow"], ["tfdist", "train"])
    with pytest.raises(ValueError, match=r"argument `preload`.*module names"):
        check_preload(["tensor flow"], [sys.executable, "train.py"])
    assert check_preload("tensorflow,keras", [sys.executable, "-m", "tfdist"]) == (
        "tensorflow",
        "keras",
    )
    assert check_preload(None, ["anything"]) == () and check_preload([], ["anything"]) == ()
    assert is_python_command(["python3", "-m", "tfdist", "train"])
    assert not is_python_command(["python3", "-u", "train.py"])  # interpreter options: no
    # A module that cannot be imported: the launch fails before any task, with its error.
    with pytest.raises(RuntimeError, match=r"(?s)did not start.*No module named 'no_such_module'"):
        local.launch(
            [sys.executable, "-c", "pass"],
            workers=1,
            output=io.StringIO(),
            preload=["no_such_module"],
        )
    proc = run_tfdist("launch", "--workers=1", "--preload=tensorflow", "--", "true", timeout=60)
    assert proc.returncode == 2 and "Invalid value for argument `preload`" in proc.stdout


def test_a_line_the_preloaded_python_prints_with_its_ready_line_does_not_hide_it(tmp_path):
    # The module's line waits in a block-buffered stdout and goes out in one write with the
    # READY line; the launcher must still see READY at once, not after its 300 s.
    (tmp_path / "chatty_module.py").write_text(
        textwrap.dedent("""
            import io, sys
            sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)))
            sys.stdout.write("imported\\n")
        """)
    )
    proc = run_tfdist(
        "launch",
        "--workers=1",
        "--preload=chatty_module",
        "--",
        sys.executable,
        "-c",
        "import sys; print('chatty_module' in sys.modules)",
        env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "TFDIST_PRELOAD_SERVER": ""},
        timeout=60,
    )
    assert proc.returncode == 0 and "[worker:0] True" in proc.stdout, proc.stdout
    assert "[preload] imported" in proc.stdout
