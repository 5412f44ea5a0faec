"""The suite's xdist scheduler (tests/xdist_scheduling.py) on a tiny suite whose worker crashes.

A real ``pytest -n 2 --dist loadscope`` run in a subprocess: one test kills its worker process
(``os._exit``), several modules hold one test each. The run must end, report that one test as
failed, run every other test, and keep the order it was given.
"""

import os
import subprocess
import sys
import textwrap

from tests.helpers import REPO

_CONFTEST = textwrap.dedent("""
    from tests.xdist_scheduling import scheduler

    def pytest_xdist_make_scheduler(config, log):
        return scheduler(config, log, first=("test_z_first.py",))
""")


def test_a_crashed_worker_is_replaced_and_the_run_ends(tmp_path):
    (tmp_path / "conftest.py").write_text(_CONFTEST)
    (tmp_path / "test_a.py").write_text("def test_1(): pass\ndef test_2(): pass\n")
    (tmp_path / "test_b.py").write_text(
        "import os\ndef test_crash(): os._exit(1)\ndef test_after(): pass\n"
    )
    for name in ("c", "d", "e", "f", "z_first"):
        (tmp_path / f"test_{name}.py").write_text("def test_only(): pass\n")
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadscope", "-p", "no:cacheprovider"]
        + ["-o", "addopts=", "-rA", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = proc.stdout + proc.stderr
    assert "replacing crashed worker" in out, out
    assert "FAILED test_b.py::test_crash" in out, out
    passed = [line for line in out.splitlines() if line.startswith("PASSED ")]
    assert len(passed) == 8, out  # every other test ran once


class _DeadWorker:
    """A worker whose channel is closed: it died before xdist noticed."""

    shutting_down = False

    def send_runtest_some(self, indexes):
        raise OSError("cannot send (already closed?)")


def test_work_sent_to_a_worker_that_just_died_goes_back_on_the_queue():
    from collections import OrderedDict

    from tests.xdist_scheduling import Scheduling

    dead = _DeadWorker()
    scheduling = Scheduling.__new__(Scheduling)  # no pytest config: only the queue matters
    scheduling.workqueue = OrderedDict({"test_c.py": {"test_c.py::test_only": False}})
    done = {"test_b.py::test_1": True, "test_b.py::test_crash": False}
    scheduling.assigned_work = {dead: {"test_b.py": done}}
    scheduling.registered_collections = {dead: ["test_b.py::test_1", "test_c.py::test_only"]}
    scheduling._assign_work_unit(dead)  # no OSError: the unit stays with the dead worker
    assert list(scheduling.assigned_work[dead]) == ["test_b.py", "test_c.py"]
    assert scheduling.remove_node(dead) == "test_b.py::test_crash"
    assert list(scheduling.workqueue) == ["test_c.py"]  # back on the queue, to run elsewhere
