"""Start one local process per cluster task, with TF_CONFIG set, and supervise them.

This is what ``tfdist launch`` runs::

    tfdist launch --workers=2 --ps=1 -- python train.py

Every process gets its own TF_CONFIG on a loopback cluster and its own process
group. Their output is merged line by line, each line prefixed ``[worker:0] ``.
The job succeeds when every chief, worker and evaluator exits 0; parameter
servers never exit on their own and are stopped once the workers are done.
Any failure stops the whole job. No TensorFlow is imported here.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Mapping, Sequence, TextIO

from tfdist import cluster as cluster_lib
from tfdist.config import invalid_argument

logger = logging.getLogger(__name__)

TIMEOUT_RETURNCODE = 124  # As timeout(1) returns.
_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class Task:
    """One task of the cluster: ``Task("worker", 1)`` prints as ``worker:1``."""

    task_type: str
    task_id: int

    def __str__(self) -> str:
        return f"{self.task_type}:{self.task_id}"


@dataclass
class TaskResult:
    """How one task's process ended.

    Attributes:
        task_type: The task type, e.g. ``worker``.
        task_id: The task index.
        returncode: The exit code, or None if it died by a signal or never ended.
        signal: The name of the signal that ended it (e.g. ``SIGTERM``), if any.
        stopped_by_launcher: True when the launcher ended it (failure elsewhere,
            timeout, Ctrl-C, or a parameter server no longer needed).
    """

    task_type: str
    task_id: int
    returncode: int | None
    signal: str | None
    stopped_by_launcher: bool = False

    def describe(self) -> str:
        """E.g. ``worker:1 exited with code 3`` or ``ps:0 terminated by launcher``."""
        name = f"{self.task_type}:{self.task_id}"
        if self.stopped_by_launcher:
            how = self.signal or (f"exit code {self.returncode}" if self.returncode is not None else "")
            return f"{name} terminated by launcher" + (f" ({how})" if how else "")
        if self.signal is not None:
            return f"{name} killed by signal {self.signal}"
        return f"{name} exited with code {self.returncode}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def task_env(cluster: dict[str, list[str]], task_type: str, task_id: int,
             base_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Returns the environment for one task.

    Args:
        cluster: Task type -> list of ``"host:port"``.
        task_type: The task's type.
        task_id: The task's index.
        base_env: The environment to copy; defaults to ``os.environ``.

    Returns:
        A copy of ``base_env`` with TF_CONFIG set, PYTHONUNBUFFERED=1 and
        TF_CPP_MIN_LOG_LEVEL defaulting to ``"2"``.

    Raises:
        ValueError: If the cluster or the task is invalid.
    """
    info = cluster_lib.parse_tf_config({"cluster": cluster, "task": {"type": task_type, "index": task_id}})
    env = dict(os.environ if base_env is None else base_env)
    env["TF_CONFIG"] = json.dumps(info.to_tf_config())
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Supervisor:
    """Starts the tasks' processes, streams their output and decides the outcome.

    Args:
        command: The command every task runs.
        cluster: Task type -> list of ``"host:port"``.
        env: The base environment of every task; defaults to ``os.environ``.
        output: Where prefixed output lines go.
        grace_period: Seconds between SIGTERM and SIGKILL when stopping tasks.
        max_restarts: Restarts allowed after failures. With parameter servers
            only a failed worker restarts (the coordinator reschedules its
            steps meanwhile); otherwise (MultiWorkerMirrored: a collective
            cannot lose a member) the whole group restarts.
    """

    def __init__(self, command: Sequence[str], cluster: dict[str, list[str]], *,
                 env: Mapping[str, str] | None, output: TextIO, grace_period: float = 5.0,
                 max_restarts: int = 0):
        self.command = list(command)
        self.cluster = cluster
        self.env = env
        self.output = output
        self.grace_period = grace_period
        self.tasks = [Task(t, i) for t in ("chief", "worker", "ps", "evaluator")
                      for i in range(len(cluster.get(t, [])))]
        self.results: dict[Task, TaskResult] = {}
        self._procs: dict[Task, subprocess.Popen] = {}
        self._readers: list[threading.Thread] = []
        self._stopping: set[Task] = set()
        self._output_lock = threading.Lock()
        self._signals: list[int] = []
        self.max_restarts = max_restarts
        self.restarts = 0
        self.parameter_server_mode = bool(cluster.get("ps"))

    def start_task(self, task: Task) -> None:
        """Starts ``task``'s process in its own process group, with a reader thread."""
        proc = subprocess.Popen(
            self.command, env=task_env(self.cluster, task.task_type, task.task_id, self.env),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True)
        self._procs[task] = proc
        self.results.pop(task, None)
        reader = threading.Thread(target=self._stream, args=(task, proc), daemon=True,
                                  name=f"tfdist-output-{task}")
        reader.start()
        self._readers.append(reader)

    def _stream(self, task: Task, proc: subprocess.Popen) -> None:
        prefix = f"[{task}] "
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            if not line.endswith("\n"):
                line += "\n"
            with self._output_lock:
                self.output.write(prefix + line)
                self.output.flush()
        proc.stdout.close()

    def run(self, timeout: float | None = None) -> int:
        """Starts every task and waits for the job's outcome.

        Args:
            timeout: Seconds after which every task is killed, or None.

        Returns:
            0 on success; the failing task's exit code (or 1); 128 + signal number
            when the launcher was interrupted; :data:`TIMEOUT_RETURNCODE` on timeout.
        """
        handlers = self._install_signal_handlers()
        returncode, reason = 1, "the launcher stopped unexpectedly"
        try:
            for task in self.tasks:
                self.start_task(task)
            returncode, reason = self._wait(timeout)
        finally:
            self._stop(set(self._procs) - set(self.results))
            for reader in self._readers:
                reader.join(timeout=1.0)
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            self._log_summary(returncode, reason)
        return returncode

    def _wait(self, timeout: float | None) -> tuple[int, str]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._signals:
                signum = self._signals[0]
                self._stop(set(self._procs) - set(self.results), signum)
                return 128 + signum, f"the launcher received {_signal_name(signum)}"
            for task, proc in list(self._procs.items()):
                if task not in self.results and proc.poll() is not None:
                    result = self._record(task, proc.returncode)
                    if proc.returncode == 0:
                        continue
                    if self._recover(task, result):
                        break
                    if self.parameter_server_mode and task.task_type == "ps":
                        self._let_chief_report()
                    self._stop(set(self._procs) - set(self.results))
                    code = proc.returncode if proc.returncode > 0 else 1
                    if self.max_restarts:
                        return code, f"{result.describe()} after {self.restarts} of {self.max_restarts} restarts"
                    return code, result.describe()
            if self.parameter_server_mode and any(t.task_type == "chief" for t in self.tasks):
                # The chief coordinates: when it is done, so is the job.
                workers_done = all(t in self.results for t in self.tasks if t.task_type in ("chief", "evaluator"))
            else:
                workers_done = all(t in self.results for t in self.tasks if t.task_type != "ps")
            if workers_done:
                self._stop(set(self._procs) - set(self.results))  # Only parameter servers are left.
                return 0, ""
            if deadline is not None and time.monotonic() > deadline:
                self._stop(set(self._procs) - set(self.results), grace_period=0.0)
                return TIMEOUT_RETURNCODE, f"the job exceeded its timeout of {timeout:g} s"
            time.sleep(_POLL_SECONDS)

    def _let_chief_report(self, seconds: float = 30.0) -> None:
        """Gives the chief time to notice a lost ps and print its own error."""
        chief = next((t for t in self.tasks if t.task_type == "chief"), None)
        if chief is None or chief in self.results:
            return
        try:
            self._procs[chief].wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return
        self._record(chief, self._procs[chief].returncode)

    def _recover(self, task: Task, result: TaskResult) -> bool:
        """Handles a failed task; True if the job goes on (restarted or tolerated)."""
        ps_worker = self.parameter_server_mode and task.task_type == "worker"
        if self.restarts < self.max_restarts:
            self.restarts += 1
            if ps_worker:
                logger.warning("%s; restarting %s alone (restart %d of %d).", result.describe(), task,
                               self.restarts, self.max_restarts)
                self.start_task(task)
            else:
                logger.warning("%s; restarting the whole group (restart %d of %d).", result.describe(),
                               self.restarts, self.max_restarts)
                self._stop(set(self._procs) - set(self.results))
                self._stopping.clear()
                for t in self.tasks:
                    self.start_task(t)
            return True
        if ps_worker and any(t.task_type == "worker" and t not in self.results for t in self.tasks):
            logger.warning("%s; no restarts left, the coordinator goes on with the other workers.",
                           result.describe())
            return True
        return False

    def _record(self, task: Task, returncode: int) -> TaskResult:
        name = _signal_name(-returncode) if returncode < 0 else None
        self.results[task] = TaskResult(task.task_type, task.task_id,
                                        None if name else returncode, name, task in self._stopping)
        return self.results[task]

    def _stop(self, tasks: set[Task], signum: int = signal.SIGTERM,
              grace_period: float | None = None) -> None:
        """Sends ``signum`` to the tasks' process groups, then SIGKILL after the grace period."""
        grace_period = self.grace_period if grace_period is None else grace_period
        pending = [t for t in self.tasks if t in tasks]
        self._stopping.update(pending)
        for task in pending:
            self._signal_group(task, signum)
        deadline = time.monotonic() + grace_period
        while pending:
            pending = [t for t in pending if self._procs[t].poll() is None]
            if not pending:
                break
            if time.monotonic() >= deadline or len(self._signals) > 1:  # A second Ctrl-C kills.
                for task in pending:
                    self._signal_group(task, signal.SIGKILL)
                deadline = float("inf")
            time.sleep(_POLL_SECONDS)
        for task in self.tasks:
            if task in tasks:
                self._record(task, self._procs[task].wait())

    def _signal_group(self, task: Task, signum: int) -> None:
        try:
            os.killpg(self._procs[task].pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def _install_signal_handlers(self) -> dict[int, object]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, lambda s, _frame: self._signals.append(s))
        return previous

    def _log_summary(self, returncode: int, reason: str) -> None:
        tasks = "; ".join(self.results[t].describe() if t in self.results else f"{t} was not started"
                          for t in self.tasks)
        if returncode == 0:
            logger.info("Job succeeded: %s.", tasks)
        else:
            logger.error("Job failed (return code %d): %s. Tasks: %s.", returncode, reason, tasks)


def launch(command: Sequence[str], *, workers: int, ps: int = 0, chief: bool = False,
           evaluator: bool = False, host: str = "127.0.0.1", allow_external: bool = False,
           ports: Sequence[int] | None = None, env: Mapping[str, str] | None = None,
           output: TextIO | None = None, timeout: float | None = None, max_restarts: int = 0) -> int:
    """Runs ``command`` once per task of a local cluster and supervises the processes.

    Args:
        command: The program and its arguments, e.g. ``[sys.executable, "train.py"]``.
        workers: The number of workers (>= 1).
        ps: The number of parameter servers.
        chief: Whether to add a chief task.
        evaluator: Whether to add an evaluator task.
        host: The address every task listens on. Must be loopback unless
            ``allow_external`` is set.
        allow_external: Allow a non-loopback ``host``. TF's gRPC servers are
            unauthenticated and execute any graph sent to them.
        ports: One port per task (chief, workers, ps, evaluator); free ports by default.
        env: The base environment of every task; defaults to ``os.environ``.
        output: Where the prefixed output lines go; defaults to ``sys.stdout``.
        timeout: Seconds after which every task is killed, or None.
        max_restarts: Restarts allowed after failures (see :class:`Supervisor`).
            With parameter servers a failed worker is restarted alone, and once
            restarts run out the coordinator goes on with the other workers.

    Returns:
        0 when every chief, worker and evaluator exited 0; otherwise the failing
        task's exit code (or 1), 130/143 when interrupted by SIGINT/SIGTERM, or
        124 on timeout.

    Raises:
        ValueError: On a bad argument, a port in use, or a command that cannot start.
    """
    if isinstance(command, (str, bytes)) or not command or not all(isinstance(c, str) for c in command):
        raise invalid_argument("command", command, "a non-empty list of strings, e.g. ['python', 'train.py']")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise invalid_argument("max_restarts", max_restarts, "a non-negative integer")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or timeout <= 0):
        raise invalid_argument("timeout", timeout, "a positive number of seconds or None")
    if not cluster_lib.is_loopback(host):
        if not allow_external:
            raise invalid_argument(
                "host", host, "a loopback address such as 127.0.0.1 or localhost",
                note="TF's gRPC servers have no authentication and run any graph sent to them; "
                     "pass --allow_external to listen on other addresses anyway.")
        logger.warning(
            "Listening on %s, which is not loopback: TF's gRPC servers are unauthenticated and "
            "execute any graph sent to them, so anyone who can reach this host can run code "
            "as this user. Use it only on a trusted, firewalled network.", host)
    cluster = cluster_lib.make_cluster(workers=workers, ps=ps, chief=chief, evaluator=evaluator,
                                       host=host, ports=ports)
    if ports is not None:
        for i, port in enumerate(ports):
            cluster_lib.check_port_free(host, port, what=f"ports[{i}]")
    supervisor = Supervisor(command, cluster, env=env, output=sys.stdout if output is None else output,
                            max_restarts=max_restarts)
    try:
        return supervisor.run(timeout)
    except FileNotFoundError as e:
        raise invalid_argument("command", list(command), "a program that exists",
                               note=f"Starting it failed: {e}.") from None
