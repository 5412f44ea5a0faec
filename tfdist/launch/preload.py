"""``tfdist launch --preload=tensorflow,keras``: import once, then fork every task from there.

Each Python task of a launch imports TensorFlow and Keras when it starts: about 6
CPU-seconds per process on a 2-core Xeon, paid again by every restarted task. With
``preload``, the launcher starts one more process first, inside the tasks'
sandbox: a Python that imports the named modules and then waits
(``tfdist/launch/_zygote.py``). Every task, restarts included, is then forked from
it and runs its script in that interpreter: it starts with the modules imported.
Everything else is as without preload: each task has its own process, TF_CONFIG,
CPUs, thread pools, process group and namespaces, its output is prefixed, and the
launcher's signals reach it.

The command must be ``PYTHON SCRIPT [ARGS]``, ``PYTHON -m MODULE [ARGS]`` or
``PYTHON -c CODE [ARGS]`` (no interpreter options); the preloaded interpreter is
that ``PYTHON``. Anything the preloaded modules read when imported comes from the
launch's environment: TensorFlow reads ``TF_CPP_MIN_LOG_LEVEL`` and
``TF_ENABLE_ONEDNN_OPTS`` at import, so a script that sets them before its
``import tensorflow`` does not change them under ``--preload=tensorflow``.
Linux only (the tasks are forked inside the launch's sandbox). No TensorFlow is
imported here.

**A preloaded interpreter shared by many launches.** Where many launches run one after
another (a test suite, a notebook), each paying the import again can be avoided: start
``python -m tfdist.launch.preload SOCKET tensorflow keras`` once (`serve`) and set
``TFDIST_PRELOAD_SERVER=SOCKET`` in the launches' environment. Each launch with
``preload`` then has that interpreter fork its own preloaded interpreter (in a fraction of
a second) instead of starting one; that fork enters the launch's network and PID
namespaces, so its tasks run in them as before. It is used only where the result is the
same: the same Python, the launch's modules among those it imported, and the same
`IMPORT_ENV` variables; otherwise the launch warns why and
starts its own. The tasks' CPU time then reaches that interpreter, not the launcher
(``RUSAGE_CHILDREN``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TextIO

from tfdist.config import invalid_argument
from tfdist.launch._zygote import IMPORT_ENV, READY
from tfdist.launch.isolation import Sandbox

logger = logging.getLogger(__name__)

_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_READY_SECONDS = 300.0
PYTHON_FORMS = "PYTHON SCRIPT [ARGS], PYTHON -m MODULE [ARGS] or PYTHON -c CODE [ARGS]"


def check_preload(preload: Sequence[str] | str | None, command: Sequence[str]) -> tuple[str, ...]:
    """The module names to preload (none: ``()``), checked against ``command``.

    Raises:
        ValueError: For a name that is not a module name, preload off Linux, or a
            command that is not a plain Python command.
    """
    if preload is None:
        return ()
    names = tuple(preload.split(",") if isinstance(preload, str) else preload)
    names = tuple(n.strip() if isinstance(n, str) else n for n in names if n != "")
    for name in names:
        if not isinstance(name, str) or not _MODULE_NAME.fullmatch(name):
            raise invalid_argument(
                "preload",
                list(names),
                "module names, e.g. tensorflow,keras",
                note=f"Bad: {name!r}.",
            )
    if names and not sys.platform.startswith("linux"):
        raise invalid_argument("preload", list(names), "no modules: forking tasks needs Linux")
    if names and not is_python_command(command):
        raise invalid_argument(
            "preload",
            list(names),
            f"no modules for the command {list(command)}",
            note=f"Preloaded tasks are forked from one Python: the command must be {PYTHON_FORMS}, "
            "e.g. `python -m tfdist train` rather than `tfdist train`.",
        )
    return names


def is_python_command(command: Sequence[str]) -> bool:
    """Whether ``command`` is ``PYTHON SCRIPT|-m MODULE|-c CODE [ARGS]`` with no other options."""
    if len(command) < 2 or not os.path.basename(command[0]).startswith("python"):
        return False
    if command[1] in ("-m", "-c"):
        return len(command) >= 3
    return not command[1].startswith("-")


#: The variable naming the socket of a preloaded interpreter shared by many launches.
SHARED_SERVER_ENV = "TFDIST_PRELOAD_SERVER"


def shared_server(
    python: str, modules: Sequence[str], env: Mapping[str, str]
) -> tuple[str | None, str | None]:
    """The shared preloaded interpreter (``TFDIST_PRELOAD_SERVER``) a launch can fork from.

    Returns:
        ``(socket, None)`` where it gives the tasks what their own would; ``(None, why)``
        where the variable is set but it would not; ``(None, None)`` where it is unset.
    """
    path = env.get(SHARED_SERVER_ENV)
    if not path:
        return None, None
    try:
        with open(path + ".json") as f:
            server = json.load(f)
    except (OSError, ValueError) as e:
        return None, f"{SHARED_SERVER_ENV}={path} names no running preloaded interpreter ({e})"
    try:
        os.kill(server["pid"], 0)
    except ProcessLookupError:
        return None, (
            f"{SHARED_SERVER_ENV}={path} names no running preloaded interpreter "
            f"(its process {server['pid']} has ended)"
        )
    except PermissionError:
        pass  # Alive, another user's.
    executable = os.path.abspath(shutil.which(python) or python)
    if server["python"] != executable:
        return None, f"it runs {server['python']}, the tasks {executable}"
    if not set(modules) <= set(server["modules"]):
        return None, f"it imported {server['modules']}, not all of {list(modules)}"
    differ = [k for k in IMPORT_ENV if env.get(k) != server["import_env"].get(k)]
    if differ:
        return None, "the tasks' environment differs in " + ", ".join(differ)
    return path, None


class Preloader:
    """The preloaded interpreter of one launch: started in ``sandbox``, stopped by `close`.

    Args:
        python: The interpreter (the command's first word).
        modules: The modules it imports before it forks any task.
        sandbox: The started sandbox of the launch's tasks.
        env: The tasks' base environment.
        output: Where its own output lines go, prefixed ``[preload] ``.
    """

    def __init__(
        self,
        python: str,
        modules: Sequence[str],
        *,
        sandbox: Sandbox,
        env: Mapping[str, str] | None,
        output: TextIO,
    ):
        self.python, self.modules, self.sandbox = python, tuple(modules), sandbox
        self.env = dict(os.environ if env is None else env)
        self.env.pop("TF_CONFIG", None)  # Each task gets its own.
        self.output = output
        self._dir = tempfile.mkdtemp(prefix="tfdist-preload-")
        self.socket = os.path.join(self._dir, "zygote.sock")
        self._proc: subprocess.Popen | None = None
        self._started, self._shared = 0.0, None

    @property
    def pid(self) -> int | None:
        """The pid of the interpreter's sandbox helper (this process's child) while it runs."""
        return None if self._proc is None else self._proc.pid

    def start(self) -> None:
        """Starts the interpreter and waits until it has imported the modules.

        Raises:
            RuntimeError: If it exits or does not get ready in time, with its output.
        """
        self.spawn()
        self.wait()

    def spawn(self) -> None:
        """Starts the interpreter, which imports while the caller goes on; `wait` follows."""
        self._started = time.monotonic()
        self._shared, why = shared_server(self.python, self.modules, self.env)
        if why is not None:
            logger.warning("Not forking from the shared preloaded interpreter: %s.", why)
        self._proc = subprocess.Popen(
            self.sandbox.wrap(self._command(), zygote=self._shared, zygote_outside=True),
            # Unbuffered: readline() after select() must not read past the line it returns, or a
            # READY line that came in the same read would wait in a buffer select() cannot see.
            bufsize=0,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait(self) -> None:
        """Waits until the interpreter `spawn` started has imported the modules.

        Its output goes on to ``output`` from then on.

        Raises:
            RuntimeError: If it exits or does not get ready in time, with its output
                (it is stopped then).
        """
        seen = self._wait_ready()
        if seen is not None:
            self.close()
            raise RuntimeError(
                f"The preloaded interpreter ({' '.join(self._command())}) did not start; its "
                "output:\n" + "".join(seen)
            )
        logger.info(
            "Preloaded %s in %.1f s%s; every task is forked from that interpreter.",
            ", ".join(self.modules),
            time.monotonic() - self._started,
            f" (forked from the shared one at {self._shared})" if self._shared else "",
        )
        threading.Thread(target=self._forward, daemon=True, name="tfdist-preload-output").start()

    def _command(self) -> list[str]:
        return [self.python, "-m", "tfdist.launch._zygote", self.socket, *self.modules]

    def _wait_ready(self) -> list[str] | None:
        """None once READY was printed; else the lines it printed before it failed."""
        seen: list[str] = []
        deadline = time.monotonic() + _READY_SECONDS
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self._proc.stdout], [], [], 1.0)
            if not ready:
                continue
            line = self._proc.stdout.readline().decode("utf-8", errors="replace")
            if not line:
                return seen
            if line.strip() == READY:
                return None
            seen.append(line)
            self._write(line)
        return [*seen, f"(not ready after {_READY_SECONDS:.0f} s)\n"]

    def _forward(self) -> None:
        for raw in iter(self._proc.stdout.readline, b""):
            self._write(raw.decode("utf-8", errors="replace"))

    def _write(self, line: str) -> None:
        self.output.write("[preload] " + (line if line.endswith("\n") else line + "\n"))
        self.output.flush()

    def close(self) -> None:
        """Stops the interpreter (a task still running then dies with it) and its socket.

        SIGTERM first: its sandbox helper ignores it and reaps the interpreter, so the
        CPU time of the interpreter and of every task it reaped reaches this process
        (``RUSAGE_CHILDREN``), as it does without preload (forked from a shared one, it
        reaches that one instead). SIGKILL after 10 s.
        """
        proc, self._proc = self._proc, None
        if proc is not None:
            for signum, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, None)):
                try:
                    os.killpg(proc.pid, signum)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


def serve(argv: Sequence[str]) -> None:
    """``python -m tfdist.launch.preload SOCKET MODULE...``: a preloaded Python for many launches.

    Imports each MODULE, serves ``SOCKET`` and prints ``tfdist-zygote-ready``; launches whose
    environment has ``TFDIST_PRELOAD_SERVER=SOCKET`` then fork from it (see above). It runs
    until killed. Linux only. Whoever can connect to ``SOCKET`` can have it run commands as
    this user: put it in a directory only you can enter (``mktemp -d``).

    Raises:
        SystemExit: With code 1 and the usage, for no SOCKET, or a MODULE that is not a
            module name.
    """
    usage = "usage: python -m tfdist.launch.preload SOCKET MODULE... (e.g. tensorflow keras)"
    if not argv or argv[0].startswith("-"):
        raise SystemExit(f"{usage}\nReceived: {list(argv)}")
    bad = [m for m in argv[1:] if not _MODULE_NAME.fullmatch(m)]
    if bad:
        raise SystemExit(f"{usage}\nNot module names: {bad}")
    from tfdist.launch._zygote import main

    main(list(argv))


if __name__ == "__main__":
    serve(sys.argv[1:])
