"""One preloaded Python per pytest process, shared by every launch of the tests that preloads.

The multi-process tests launch with ``--preload=tensorflow,keras`` (``tests.helpers.PRELOAD``):
each launch's tasks are forked from one Python that imported TensorFlow and Keras. Without
this module each launch starts that Python itself: an import of TF and Keras (8-9 CPU-s on
the 2-core Xeon on 2026-12-03) per launch, 31 launches a run. With it, the pytest process
starts ``python -m tfdist.launch.preload SOCKET tensorflow keras`` once when it is configured,
and sets ``TFDIST_PRELOAD_SERVER`` (:mod:`tfdist.launch.preload`) before its first test: each
launch then forks its preloaded Python from that one, which enters the launch's network and
PID namespaces. A launch whose environment differs in what the imports read starts its own,
with a warning, as the variable's contract says.

Not in xdist's controller (it runs no test), nor in runs that select no multi-process test
(``-m "not multiprocess"``), nor off Linux; ``TFDIST_TEST_SHARED_PRELOAD=0`` turns it off.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from tests.helpers import PRELOAD_MODULES
from tfdist.launch import isolation
from tfdist.launch.preload import READY, SHARED_SERVER_ENV

_READY_SECONDS = 120.0
_server: dict = {}


def wanted(config) -> bool:
    """Whether this pytest process runs tests, some of which may launch with preload."""
    if os.environ.get("TFDIST_TEST_SHARED_PRELOAD") == "0" or not sys.platform.startswith("linux"):
        return False
    if getattr(config, "workerinput", None) is None and config.getoption("numprocesses", None):
        return False  # xdist's controller: its workers run the tests.
    return "not multiprocess" not in (config.getoption("markexpr", "") or "")


def start() -> None:
    """Starts the shared Python (it imports while pytest collects); :func:`ready` waits for it."""
    directory = tempfile.mkdtemp(prefix="tfdist-shared-preload-")
    path = os.path.join(directory, "zygote.sock")
    # Under the launcher's task helper (a sandbox with no namespaces started): it dies with this
    # process, and takes the Python along.
    command = isolation.Sandbox(private_network=False).wrap(
        [sys.executable, "-m", "tfdist.launch.preload", path, *PRELOAD_MODULES]
    )
    env = {k: v for k, v in os.environ.items() if k != SHARED_SERVER_ENV}
    proc = subprocess.Popen(
        command,
        bufsize=0,  # readline() after select(): no line may wait in a buffer (see preload.py).
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    _server.update(proc=proc, path=path, directory=directory)


def ready() -> None:
    """Waits until the shared Python has imported; then every launch here may fork from it."""
    proc = _server.get("proc")
    if proc is None or os.environ.get(SHARED_SERVER_ENV) == _server["path"]:
        return
    deadline, seen = time.monotonic() + _READY_SECONDS, []
    while time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 1.0)[0]:
            line = proc.stdout.readline().decode("utf-8", errors="replace")
            if line.strip() == READY:
                os.environ[SHARED_SERVER_ENV] = _server["path"]
                return
            if not line:
                break
            seen.append(line)
    stop()
    raise RuntimeError("the shared preloaded Python did not start:\n" + "".join(seen[-40:]))


def pid() -> int | None:
    """The pid of the shared Python's helper (this process's child), while it runs."""
    proc = _server.get("proc")
    return None if proc is None else proc.pid


def stop() -> None:
    """Stops the shared Python (a launch still using it has ended by then) and its socket."""
    proc = _server.pop("proc", None)
    os.environ.pop(SHARED_SERVER_ENV, None)
    if proc is not None:
        # SIGTERM to the group: the helper ignores it and reaps the Python, so the CPU time of
        # the Python and of every launch it forked reaches this process (RUSAGE_CHILDREN).
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        shutil.rmtree(_server.pop("directory"), ignore_errors=True)
