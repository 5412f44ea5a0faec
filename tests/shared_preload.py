"""One preloaded Python per pytest process, shared by every launch of the tests that preloads.

The multi-process tests launch with ``--preload=tensorflow,keras`` (``tests.helpers.PRELOAD``):
each launch's tasks are forked from one Python that imported TensorFlow and Keras. Without
this module each launch starts that Python itself: an import of TF and Keras (8-9 CPU-s on
the 2-core Xeon on 2026-12-03) per launch, 31 launches a run. With it, the pytest process
starts a preloaded Python (:class:`tfdist.launch.preload.Preloader`) once it has collected a
multi-process test, and sets ``TFDIST_PRELOAD_SERVER`` (:mod:`tfdist.launch.preload`) before the
first such test (tests before it run while it imports): each launch then forks its preloaded
Python from that one, which enters the launch's network and
PID namespaces. A launch whose environment differs in what the imports read starts its own,
with a warning, as the variable's contract says.

Not in xdist's controller (it runs no test), nor in a process that runs no multi-process test,
nor off Linux; ``TFDIST_TEST_SHARED_PRELOAD=0`` turns it off.
"""

from __future__ import annotations

import os
import sys

from tests.helpers import PRELOAD_MODULES
from tfdist.launch import isolation
from tfdist.launch.preload import SHARED_SERVER_ENV, Preloader

MARK = "multiprocess"
_server: dict = {}


def wanted(config, items) -> bool:
    """Whether this pytest process runs tests (``items``), some of which may launch with preload."""
    if os.environ.get("TFDIST_TEST_SHARED_PRELOAD") == "0" or not sys.platform.startswith("linux"):
        return False
    if getattr(config, "workerinput", None) is None and config.getoption("numprocesses", None):
        return False  # xdist's controller: its workers run the tests.
    if config.getoption("collectonly", False):
        return False
    return any(item.get_closest_marker(MARK) for item in items)


def start() -> None:
    """Starts the shared Python, which imports while tests go on; :func:`ready` waits for it."""
    # Under the launcher's task helper (a sandbox with no namespaces started): it dies with this
    # process, and takes the Python along. Its own output is read, and shown only if it fails.
    env = {k: v for k, v in os.environ.items() if k != SHARED_SERVER_ENV}
    sink = open(os.devnull, "w")  # noqa: SIM115 (open for the whole session)
    preloader = Preloader(
        sys.executable,
        PRELOAD_MODULES,
        sandbox=isolation.Sandbox(private_network=False),
        env=env,
        output=sink,
    )
    preloader.spawn()
    _server.update(preloader=preloader, sink=sink)


def ready(item) -> None:
    """Before a multi-process test: waits until the shared Python has imported (once)."""
    preloader = _server.get("preloader")
    if preloader is None or not item.get_closest_marker(MARK):
        return
    if not _server.get("ready"):  # wait() reads its output once; a second would wait it out
        try:
            preloader.wait()
        except RuntimeError:
            stop()
            raise
        _server["ready"] = True
        os.environ[SHARED_SERVER_ENV] = preloader.socket


def pid() -> int | None:
    """The pid of the shared Python's helper (this process's child), while it runs."""
    preloader = _server.get("preloader")
    return None if preloader is None else preloader.pid


def stop() -> None:
    """Stops the shared Python (a launch still using it has ended by then) and its socket.

    The helper reaps the Python on SIGTERM, so the CPU time of the Python and of every launch it
    forked reaches this process (RUSAGE_CHILDREN).
    """
    preloader = _server.pop("preloader", None)
    os.environ.pop(SHARED_SERVER_ENV, None)
    if preloader is not None:
        preloader.close()
        _server.pop("sink").close()
        _server.pop("ready", None)
