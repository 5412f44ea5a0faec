"""Process supervision for ``tfdist launch``: spawn, watch, restart, forward signals, stop.

`Supervisor` runs one process per `Task`,
merges their output line by line (each line prefixed ``[worker:0] ``), and
decides the job's outcome:

* it succeeds when every chief, worker and evaluator exits 0; parameter
  servers never exit on their own and are stopped once those are done;
* a failure stops every other task (SIGTERM, then SIGKILL after a grace
  period), unless the restart policy (`tfdist.launch.restarts`) takes it back;
* SIGINT/SIGTERM to the launcher are passed on to every task; a second one
  kills at once.

Each task runs in its own process group (session), so that a signal reaches
the task and every process it started, and a Ctrl-C in the terminal reaches
only the launcher, which then decides what the tasks get. No TensorFlow is
imported here.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

from tfdist.config import invalid_argument
from tfdist.launch.isolation import Sandbox
from tfdist.launch.pinning import Pinning
from tfdist.launch.restarts import RestartPolicy
from tfdist.launch.tasks import LaunchSpec, Task, TaskResult, all_tasks, task_env

logger = logging.getLogger(__name__)

TIMEOUT_RETURNCODE = 124  # As timeout(1) returns.
_POLL_SECONDS = 0.05


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Supervisor:
    """Starts the tasks' processes, streams their output and decides the outcome.

    Args:
        spec: The launch: every task runs ``spec.command`` in ``spec.env`` (``os.environ``
            by default), its prefixed output lines go to ``spec.output`` (``sys.stdout``
            by default), and ``spec.max_restarts`` restarts are allowed after failures.
            With parameter servers only a failed worker restarts (the coordinator
            reschedules its steps meanwhile); otherwise (MultiWorkerMirrored: a collective
            cannot lose a member) the whole group restarts.
        cluster: Task type -> list of ``"host:port"``.
        tasks: The tasks to run here; every task of ``cluster`` by default.
            A node of a multi-node job runs only its own
            (see `tfdist.launch.layout.node_cluster`).
        sandbox: Runs each task inside its namespaces (see
            `tfdist.launch.isolation.Sandbox`), or None.
        pinning: Task label (``worker:0``) -> the CPUs and TF thread pools that
            task gets, at every start (see `tfdist.launch.pinning`); the
            sandbox's helper sets the CPUs, so it needs a sandbox.
        zygote: The socket of the preloaded interpreter that forks each task (see
            `tfdist.launch.preload`), or None; it needs a sandbox, whose helper asks it.
        grace_period: Seconds between SIGTERM and SIGKILL when stopping tasks.
    """

    def __init__(
        self,
        spec: LaunchSpec,
        cluster: dict[str, list[str]],
        *,
        tasks: Sequence[Task] | None = None,
        sandbox: Sandbox | None = None,
        pinning: Mapping[str, Pinning] | None = None,
        zygote: str | None = None,
        grace_period: float = 5.0,
    ):
        if pinning and sandbox is None:
            raise invalid_argument(
                "pinning", dict(pinning), "none without a sandbox, whose helper sets the CPUs"
            )
        if zygote and sandbox is None:
            raise invalid_argument("zygote", zygote, "None without a sandbox, whose helper asks it")
        self.zygote = zygote
        self.command = list(spec.command)
        self.sandbox = sandbox
        self.pinning = dict(pinning or {})
        self.cluster = cluster
        self.env = spec.env
        self.output = sys.stdout if spec.output is None else spec.output
        self.grace_period = grace_period
        self.tasks = list(tasks) if tasks is not None else all_tasks(cluster)
        self.results: dict[Task, TaskResult] = {}
        self._procs: dict[Task, subprocess.Popen] = {}
        self._readers: list[threading.Thread] = []
        self._stopping: set[Task] = set()
        self._output_lock = threading.Lock()
        self._signals: list[int] = []
        self.parameter_server_mode = bool(cluster.get("ps"))
        self.policy = RestartPolicy(
            max_restarts=spec.max_restarts, parameter_server_mode=self.parameter_server_mode
        )

    def start_task(self, task: Task) -> None:
        """Starts ``task``'s process (on its CPUs) in its own process group, with a reader."""
        # The sandbox helper gets PR_SET_PDEATHSIG, which fires when the *thread* that forked it
        # exits, not the process: so tasks are only ever started from this one, which runs the job.
        pinning = self.pinning.get(str(task))
        env = task_env(self.cluster, task.task_type, task.task_id, self.env)
        if pinning is not None:
            env.update(pinning.env())
        command = (
            self.sandbox.wrap(
                self.command, cpus=pinning.cpus if pinning else None, zygote=self.zygote
            )
            if self.sandbox is not None
            else self.command
        )
        # start_new_session: the task and its children form one process group that _stop signals
        # as a whole, and a terminal's Ctrl-C goes to the launcher alone (it forwards it).
        proc = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._procs[task] = proc
        self.results.pop(task, None)
        reader = threading.Thread(
            target=self._stream, args=(task, proc), daemon=True, name=f"tfdist-output-{task}"
        )
        reader.start()
        self._readers.append(reader)

    def _stream(self, task: Task, proc: subprocess.Popen) -> None:
        prefix = f"[{task}] "
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            if not line.endswith("\n"):
                line += "\n"
            with self._output_lock:  # Whole lines: tasks' output never interleaves mid-line.
                self.output.write(prefix + line)
                self.output.flush()
        proc.stdout.close()

    def run(self, timeout: float | None = None) -> int:
        """Starts every task and waits for the job's outcome.

        A failed task is restarted, or given up, or fails the job, as
        `tfdist.launch.restarts.RestartPolicy` decides.

        Args:
            timeout: Seconds after which every task is killed, or None.

        Returns:
            0 on success; the failing task's exit code (or 1); 128 + signal number
            when the launcher was interrupted; `TIMEOUT_RETURNCODE` on timeout.
        """
        handlers = self._install_signal_handlers()
        returncode, reason = 1, "the launcher stopped unexpectedly"
        try:
            for task in self.tasks:
                self.start_task(task)
            returncode, reason = self._wait(timeout)
        finally:
            # Whatever happened (an exception included), no task is left running.
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
                        break  # _procs may have changed: poll afresh.
                    if self.parameter_server_mode and task.task_type == "ps":
                        self._let_chief_report()
                    self._stop(set(self._procs) - set(self.results))
                    code = proc.returncode if proc.returncode > 0 else 1
                    return code, self.policy.failure_reason(result)
            if self.parameter_server_mode and any(t.task_type == "chief" for t in self.tasks):
                # The chief coordinates: when it is done, so is the job.
                workers_done = all(
                    t in self.results for t in self.tasks if t.task_type in ("chief", "evaluator")
                )
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
        """Carries out the restart policy's decision on a failed task; True if the job goes on."""
        workers_left = any(t.task_type == "worker" and t not in self.results for t in self.tasks)
        action = self.policy.decide(task, result, workers_left=workers_left)
        if action == "restart_task":
            self.start_task(task)
        elif action == "restart_group":
            self._restart_group()
        return action != "fail"

    def _restart_group(self) -> None:
        self._stop(set(self._procs) - set(self.results))
        self._stopping.clear()  # The new processes were not stopped by us (yet).
        for t in self.tasks:
            self.start_task(t)

    def _record(self, task: Task, returncode: int) -> TaskResult:
        name = _signal_name(-returncode) if returncode < 0 else None  # Popen: -N = killed by N.
        self.results[task] = TaskResult(
            task.task_type, task.task_id, None if name else returncode, name, task in self._stopping
        )
        return self.results[task]

    def _stop(
        self, tasks: set[Task], signum: int = signal.SIGTERM, grace_period: float | None = None
    ) -> None:
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
            # A second Ctrl-C (or SIGTERM) means "now": don't wait out the grace period.
            if time.monotonic() >= deadline or len(self._signals) > 1:
                for task in pending:
                    self._signal_group(task, signal.SIGKILL)
                deadline = float("inf")
            time.sleep(_POLL_SECONDS)
        for task in self.tasks:
            if task in tasks:
                self._record(task, self._procs[task].wait())

    def _signal_group(self, task: Task, signum: int) -> None:
        try:
            # The group id is the task's pid (start_new_session), and it outlives the
            # task itself while any process it started is left.
            os.killpg(self._procs[task].pid, signum)
        except (ProcessLookupError, PermissionError):
            pass  # The whole group is gone already.

    def _install_signal_handlers(self) -> dict[int, object]:
        # Python runs signal handlers in the main thread only; elsewhere (e.g. a notebook's
        # worker thread) the caller keeps its own handlers.
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            # The handler only records the signal: the wait loop forwards it to the tasks, so that
            # stopping never runs re-entrantly in the middle of a start or a stop.
            previous[signum] = signal.signal(signum, lambda s, _frame: self._signals.append(s))
        return previous

    def _log_summary(self, returncode: int, reason: str) -> None:
        tasks = "; ".join(
            self.results[t].describe() if t in self.results else f"{t} was not started"
            for t in self.tasks
        )
        if returncode == 0:
            logger.info("Job succeeded: %s.", tasks)
        else:
            logger.error("Job failed (return code %d): %s. Tasks: %s.", returncode, reason, tasks)
