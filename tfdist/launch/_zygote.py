"""The preloaded interpreter of ``tfdist launch --preload``: imports once, then forks each task.

Run as ``python -m tfdist.launch._zygote SOCKET MODULE...`` inside the launch's
sandbox (so that the processes it forks share the tasks' namespaces). It imports
each MODULE, prints `READY`, and serves a Unix socket. Each task's sandbox
helper (``isolation/_helper.py run --zygote=SOCKET``) connects once and sends, with its
standard input, output and error (SCM_RIGHTS):

* a 4-byte big-endian length and a JSON request: ``{"command", "env", "cwd", "cpus"}``,
  and optionally ``"namespaces": ["net", "pid"]``, one more descriptor each (SCM_RIGHTS),
  after the streams: namespaces the forked child enters (``setns``) before it runs the
  command. A PID namespace takes only the child's own children: this is how an interpreter
  shared by many launches starts each launch's own preloaded interpreter, whose tasks it
  forks inside that launch's namespaces (see `tfdist.launch.preload`);
* then, at any time, lines ``S<signum>``: that signal goes to the task's process group.

The zygote forks; the child takes the helper's streams, directory, environment and
CPUs, starts a session of its own, and runs the command's script (``PYTHON SCRIPT``,
``-m MODULE`` or ``-c CODE``) as ``__main__``, in the interpreter that already holds the
preloaded modules. When the task ends, the zygote answers one line ``X<code>`` (Popen's
convention: ``-N`` for signal N) and closes. If the helper goes first (it was killed),
the task's process group gets SIGKILL. A task dies with the zygote (PR_SET_PDEATHSIG).

What a task cannot change this way: anything the preloaded modules read when they were
imported. TensorFlow reads ``TF_CPP_MIN_LOG_LEVEL`` and ``TF_ENABLE_ONEDNN_OPTS`` then, so
under ``--preload=tensorflow`` they come from the launch's environment, not from a
script that sets them before its ``import tensorflow``.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import sys
import types
from typing import Any

READY = "tfdist-zygote-ready"
#: Variables the preloaded modules read when imported: a task cannot change them (see above).
IMPORT_ENV = (
    "TF_CPP_MIN_LOG_LEVEL",
    "TF_CPP_MAX_VLOG_LEVEL",
    "TF_ENABLE_ONEDNN_OPTS",
    "TF_USE_LEGACY_KERAS",
    "KERAS_BACKEND",
    "KERAS_HOME",
    "PYTHONHASHSEED",
)
PR_SET_PDEATHSIG = 1
_NAMESPACES = {"net": 0x40000000, "pid": 0x20000000}  # CLONE_NEWNET, CLONE_NEWPID
_HEADER = struct.Struct("!I")
_TASK_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCHLD,
    signal.SIGPIPE,
)


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One request and the file descriptors sent with it (three streams, then namespaces)."""
    header, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3 + len(_NAMESPACES))
    while len(header) < _HEADER.size:
        header += conn.recv(_HEADER.size - len(header))
    (size,) = _HEADER.unpack(header)
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ConnectionError("the task's helper closed its request early")
        body += chunk
    return json.loads(body), list(fds)


class _Zygote:
    def __init__(self, path: str):
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.set_wakeup_fd(self.wake_w)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "reap")
        self.tasks: dict[int, socket.socket | None] = {}

    def serve(self) -> tuple[dict[str, Any], list[int]]:
        """Serves until a fork: returns, in the child only, the request it is to run."""
        while True:
            for key, _ in self.selector.select():
                if key.data == "accept":
                    child = self._start()
                    if child is not None:
                        return child
                elif key.data == "reap":
                    self._reap()
                else:
                    self._message(key.fileobj, key.data)

    def _start(self) -> tuple[dict[str, Any], list[int]] | None:
        conn, _ = self.listener.accept()
        try:
            request, fds = _receive(conn)
        except (OSError, ValueError) as e:
            sys.stderr.write(f"tfdist: a task's request to the preloaded interpreter failed: {e}\n")
            conn.close()
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._close_in_child(conn)
            return request, fds
        for fd in fds:
            os.close(fd)
        self.tasks[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ, pid)
        return None

    def _close_in_child(self, conn: socket.socket) -> None:
        signal.set_wakeup_fd(-1)
        self.selector.close()
        self.listener.close()
        os.close(self.wake_r)
        os.close(self.wake_w)
        for other in self.tasks.values():
            if other is not None:
                other.close()
        conn.close()

    def _reap(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.tasks.pop(pid, None)
            if conn is not None:
                self.selector.unregister(conn)
                try:
                    conn.sendall(b"X%d\n" % os.waitstatus_to_exitcode(status))
                except OSError:
                    pass
                conn.close()

    def _message(self, conn: socket.socket, pid: int) -> None:
        try:
            data = conn.recv(256)
        except OSError:
            data = b""
        if not data:  # The helper is gone (killed): so is its task.
            self.selector.unregister(conn)
            conn.close()
            self.tasks[pid] = None
            _signal_group(pid, signal.SIGKILL)
            return
        for line in data.split(b"\n"):
            if line.startswith(b"S") and line[1:].isdigit():
                _signal_group(pid, int(line[1:]))


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)  # The task started a session of its own: its group id is its pid.
    except ProcessLookupError:
        pass


def _become_task(request: dict[str, Any], fds: list[int], zygote: int) -> None:
    """In the forked child: the helper's streams, directory, environment, CPUs and signals."""
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() not in (zygote, 0):  # 0: a parent outside this PID namespace (alive).
        os._exit(1)
    libc.setns.argtypes = (ctypes.c_int, ctypes.c_int)
    for name, fd in zip(request.get("namespaces", ()), fds[3:]):
        if libc.setns(fd, _NAMESPACES[name]) != 0:
            os.write(
                fds[2],
                f"tfdist: cannot enter the {name} namespace: errno {ctypes.get_errno()}\n".encode(),
            )
            os._exit(1)
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # The interpreter's path was made from its own PYTHONPATH: add the task's entries it lacks.
    missing = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[1:1] = [p for p in missing if p not in sys.path]
    if request.get("cpus"):
        os.sched_setaffinity(0, request["cpus"])
    for signum in _TASK_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # As a fresh interpreter has it.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # Python ignores it, and raises instead.


def _run(command: list[str]) -> None:
    """Runs ``PYTHON SCRIPT|-m MODULE|-c CODE [ARGS]`` as this interpreter's ``__main__``."""
    args = command[1:]
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        sys.path[0] = ""
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(args[1], "<string>", "exec"), main.__dict__)
    else:
        sys.argv = list(args)
        sys.path[0] = os.path.dirname(os.path.realpath(args[0]))
        runpy.run_path(args[0], run_name="__main__")


def main(argv: list[str]) -> None:
    path, modules = argv[0], argv[1:]
    for name in modules:
        importlib.import_module(name)
    # What the modules made stays out of every task's garbage collections (Python's advice for a
    # process that forks workers): a full collection no longer walks it, nor writes to its pages.
    gc.collect()
    gc.freeze()
    zygote = os.getpid()
    server = _Zygote(path)
    described = {
        "pid": zygote,
        "python": sys.executable,
        "modules": modules,
        "import_env": {k: os.environ.get(k) for k in IMPORT_ENV},
    }
    with open(path + ".json", "w") as f:  # What a launch reads before it shares this one.
        json.dump(described, f)
    print(READY, flush=True)
    request, fds = server.serve()
    _become_task(request, fds, zygote)
    _run(request["command"])


if __name__ == "__main__":
    main(sys.argv[1:])
