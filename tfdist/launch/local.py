"""Start one local process per cluster task, with TF_CONFIG set, and supervise them.

This is what ``tfdist launch`` runs. On one machine (a loopback cluster)::

    tfdist launch --workers=2 --ps=1 -- python train.py

On several machines, run the same command on each, changing only ``--node_rank``::

    tfdist launch --nnodes=2 --node_rank=0 --hosts=h1:2222,h2:2222 --workers=2 --allow_external -- python train.py
    tfdist launch --nnodes=2 --node_rank=1 --hosts=h1:2222,h2:2222 --workers=2 --allow_external -- python train.py

Each launcher computes the whole cluster (see :func:`node_cluster`) and starts
only its own node's tasks. Every process gets its own TF_CONFIG and its own
process group. Their output is merged line by line, each line prefixed
``[worker:0] ``. The job succeeds when every chief, worker and evaluator exits
0; parameter servers never exit on their own and are stopped once the workers
are done. Any failure stops the whole job (on this node). No TensorFlow is
imported here.

TF's gRPC servers listen on every interface whatever TF_CONFIG says, so a
single-machine launch runs its tasks in a private network namespace that has
only loopback (see :mod:`tfdist.launch.isolation`): other hosts cannot reach
them. No task outlives the launcher, even one killed with SIGKILL: they share a
PID namespace that dies with it. Where the kernel does not allow namespaces
(not root), the launcher says so and names the ports to firewall.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Mapping, Sequence, TextIO

from tfdist import cluster as cluster_lib
from tfdist.config import PREEMPTED_EXIT_CODE, check_positive_int, invalid_argument
from tfdist.launch.isolation import Sandbox, firewall_advice

logger = logging.getLogger(__name__)

TIMEOUT_RETURNCODE = 124  # As timeout(1) returns.
_MAX_PREEMPTIONS = 100
_POLL_SECONDS = 0.05
_TASK_ORDER = ("chief", "worker", "ps", "evaluator")
_UNAUTHENTICATED = ("TF's gRPC servers are unauthenticated (no authentication) and run any graph sent to "
                    "them, so anyone who can reach their ports can run code as this user")


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
        tasks: The tasks to run here; every task of ``cluster`` by default.
            A node of a multi-node job runs only its own (see :func:`node_cluster`).
        sandbox: Runs each task inside its namespaces (see :class:`Sandbox`), or None.
    """

    def __init__(self, command: Sequence[str], cluster: dict[str, list[str]], *,
                 env: Mapping[str, str] | None, output: TextIO, grace_period: float = 5.0,
                 max_restarts: int = 0, tasks: Sequence[Task] | None = None, sandbox: Sandbox | None = None):
        self.command = list(command)
        self.sandbox = sandbox
        self.cluster = cluster
        self.env = env
        self.output = output
        self.grace_period = grace_period
        self.tasks = list(tasks) if tasks is not None else [
            Task(t, i) for t in _TASK_ORDER for i in range(len(cluster.get(t, [])))]
        self.results: dict[Task, TaskResult] = {}
        self._procs: dict[Task, subprocess.Popen] = {}
        self._readers: list[threading.Thread] = []
        self._stopping: set[Task] = set()
        self._output_lock = threading.Lock()
        self._signals: list[int] = []
        self.max_restarts = max_restarts
        self.restarts = 0
        self.preemptions = 0
        self.parameter_server_mode = bool(cluster.get("ps"))

    def start_task(self, task: Task) -> None:
        """Starts ``task``'s process in its own process group, with a reader thread."""
        # The sandbox helper dies with the thread that forks it (PR_SET_PDEATHSIG): this one, which runs the job.
        command = self.sandbox.wrap(self.command) if self.sandbox is not None else self.command
        proc = subprocess.Popen(
            command, env=task_env(self.cluster, task.task_type, task.task_id, self.env),
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
        """Handles a failed task; True if the job goes on (restarted or tolerated).

        A task that exits with :data:`PREEMPTED_EXIT_CODE` saved a backup on
        SIGTERM and asks for a restart; that does not use up ``max_restarts``.
        """
        ps_worker = self.parameter_server_mode and task.task_type == "worker"
        if result.returncode == PREEMPTED_EXIT_CODE and self.preemptions < _MAX_PREEMPTIONS:
            self.preemptions += 1
            if self.parameter_server_mode and task.task_type in ("worker", "chief"):
                logger.warning("%s: preempted after saving a backup; restarting %s.", result.describe(), task)
                self.start_task(task)
            else:
                logger.warning("%s: preempted after saving a backup; restarting the whole group.",
                               result.describe())
                self._restart_group()
            return True
        if self.restarts < self.max_restarts:
            self.restarts += 1
            if ps_worker:
                logger.warning("%s; restarting %s alone (restart %d of %d).", result.describe(), task,
                               self.restarts, self.max_restarts)
                self.start_task(task)
            else:
                logger.warning("%s; restarting the whole group (restart %d of %d).", result.describe(),
                               self.restarts, self.max_restarts)
                self._restart_group()
            return True
        if ps_worker and any(t.task_type == "worker" and t not in self.results for t in self.tasks):
            logger.warning("%s; no restarts left, the coordinator goes on with the other workers.",
                           result.describe())
            return True
        return False

    def _restart_group(self) -> None:
        self._stop(set(self._procs) - set(self.results))
        self._stopping.clear()
        for t in self.tasks:
            self.start_task(t)

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


def node_cluster(nnodes: int, node_rank: int, hosts: Sequence[str] | str | None, workers: int, ps: int = 0,
                 chief: bool = False, *, evaluator: bool = False) -> tuple[dict[str, list[str]], list[Task]]:
    """Lays out a cluster over several nodes and returns it with this node's tasks.

    Pure: no port is bound and no name is resolved. Every node computes the same
    layout from the same arguments, so the launchers agree without talking:

    * ``hosts[k]`` is node k's ``"host:base_port"``. Its tasks listen on
      consecutive ports from ``base_port``, in this order:
    * ``workers`` workers, task ids ``k*workers`` .. ``k*workers + workers - 1``;
    * then ``ps`` parameter servers, task ids ``k*ps`` .. ``k*ps + ps - 1``
      (so ``ps`` is a count per node, like ``workers``);
    * then, on node 0 only, the chief (if ``chief``), then the evaluator (if ``evaluator``).

    Pick base ports below the ephemeral range (Linux: 32768-60999), e.g. 2222,
    so that no outgoing connection happens to hold one.

    Example: ``node_cluster(2, 1, ["h1:2222", "h2:2222"], workers=2, ps=1, chief=True)``
    returns the cluster ``{"chief": ["h1:2225"], "worker": ["h1:2222", "h1:2223",
    "h2:2222", "h2:2223"], "ps": ["h1:2224", "h2:2224"]}`` and this node's tasks
    ``[worker:2, worker:3, ps:1]``.

    Args:
        nnodes: The number of nodes (>= 1).
        node_rank: This node's index into ``hosts``, in ``[0, nnodes)``.
        hosts: One ``"host:base_port"`` per node (IPv6 hosts in brackets), as a
            list or as one comma-separated string.
        workers: Workers per node (>= 1).
        ps: Parameter servers per node (>= 0).
        chief: Whether node 0 also runs the chief.
        evaluator: Whether node 0 also runs an evaluator.

    Returns:
        ``(cluster, local_tasks)``: task type -> every node's ``"host:port"``
        addresses, and the :class:`Task` objects this node runs.

    Raises:
        ValueError: On bad counts, a ``node_rank`` out of range, a ``hosts`` entry
            that is malformed or repeated, or nodes on one host whose port ranges overlap.
    """
    check_positive_int("nnodes", nnodes)
    if isinstance(node_rank, bool) or not isinstance(node_rank, int) or not 0 <= node_rank < nnodes:
        raise invalid_argument("node_rank", node_rank, f"an integer in the range [0, {nnodes - 1}]",
                               note=f"Nodes are numbered from 0 and nnodes={nnodes}.")
    check_positive_int("workers", workers)
    if isinstance(ps, bool) or not isinstance(ps, int) or ps < 0:
        raise invalid_argument("ps", ps, "a non-negative integer")
    entries, nodes = _parse_hosts(hosts, nnodes)
    cluster: dict[str, list[str]] = {t: [] for t in _TASK_ORDER}
    owners: dict[str, int] = {}
    local_tasks = []
    for k, (host, base_port) in enumerate(nodes):
        counts = {"worker": workers, "ps": ps, "chief": int(k == 0 and bool(chief)),
                  "evaluator": int(k == 0 and bool(evaluator))}
        num_tasks = sum(counts.values())
        if base_port + num_tasks - 1 > 65535:
            raise invalid_argument(f"hosts[{k}]", entries[k], f"a base port <= {65536 - num_tasks}",
                                   note=f"Node {k} runs {num_tasks} task(s) on consecutive ports from its base port.")
        port = base_port
        for task_type, count in counts.items():
            for _ in range(count):
                address = cluster_lib.join_address(host, port)
                if address.lower() in owners:
                    raise invalid_argument(
                        "hosts", entries, "nodes whose port ranges do not overlap",
                        note=f"Nodes {owners[address.lower()]} and {k} would both use {address}: a node uses "
                             f"{num_tasks} consecutive ports from its base port, so base ports on one host "
                             f"must be at least that far apart.")
                owners[address.lower()] = k
                if k == node_rank:
                    local_tasks.append(Task(task_type, len(cluster[task_type])))
                cluster[task_type].append(address)
                port += 1
    local_tasks.sort(key=lambda task: _TASK_ORDER.index(task.task_type))
    return {t: addresses for t, addresses in cluster.items() if addresses}, local_tasks


def _parse_hosts(hosts: Sequence[str] | str | None, nnodes: int) -> tuple[list[str], list[tuple[str, int]]]:
    """Checks ``hosts`` and returns its entries and their (host, base_port) pairs."""
    expected = f"{nnodes} 'host:port' entries, one per node (nnodes={nnodes}), e.g. 'h1:2222,h2:2222'"
    entries = hosts.split(",") if isinstance(hosts, str) else hosts
    if not isinstance(entries, (list, tuple)) or not all(isinstance(e, str) for e in entries):
        raise invalid_argument("hosts", hosts, expected,
                               note="More than one node (or node_rank > 0) needs to know where every node is."
                               if hosts is None else "")
    entries = [e.strip() for e in entries]
    if len(entries) != nnodes:
        raise invalid_argument("hosts", hosts, expected, note=f"It has {len(entries)}.")
    nodes: list[tuple[str, int]] = []
    seen: dict[tuple[str, int], int] = {}
    for i, entry in enumerate(entries):
        parsed = cluster_lib.split_address(entry)
        if parsed is None:
            raise invalid_argument(f"hosts[{i}]", entry, "a 'host:port' string with an integer port in 1..65535",
                                   note="The port is that of the node's first task. Write IPv6 hosts in "
                                        "brackets, e.g. '[::1]:2222'.")
        key = (parsed[0].lower(), parsed[1])
        if key in seen:
            raise invalid_argument(f"hosts[{i}]", entry, "a 'host:port' that no other node uses",
                                   note=f"hosts[{seen[key]}] is the same.")
        seen[key] = i
        nodes.append(parsed)
    return entries, nodes


def _require_loopback(name: str, value: object, external: Sequence[str], expected: str,
                      allow_external: bool) -> None:
    """Refuses non-loopback addresses unless ``allow_external``, and then warns."""
    if not external:
        return
    if not allow_external:
        raise invalid_argument(
            name, value, expected,
            note=f"Not loopback: {', '.join(external)}. {_UNAUTHENTICATED}; pass --allow_external "
                 f"(allow_external=True) to use other addresses anyway, on a trusted, firewalled network only.")
    logger.warning("Using %s, which is not loopback: %s. Use it only on a trusted, firewalled network.",
                   ", ".join(external), _UNAUTHENTICATED)


def launch(command: Sequence[str], *, workers: int, ps: int = 0, chief: bool = False,
           evaluator: bool = False, host: str = "127.0.0.1", allow_external: bool = False,
           ports: Sequence[int] | None = None, env: Mapping[str, str] | None = None,
           output: TextIO | None = None, timeout: float | None = None, max_restarts: int = 0,
           nnodes: int = 1, node_rank: int = 0, hosts: Sequence[str] | str | None = None,
           private_network: bool = True) -> int:
    """Runs ``command`` once per task of this node and supervises the processes.

    With the defaults (one node, no ``hosts``) every task of a cluster on
    ``host`` runs here. With ``hosts``, the cluster spans ``nnodes`` nodes laid
    out by :func:`node_cluster`, and only node ``node_rank``'s tasks run here;
    start one launcher per node with the same arguments but ``node_rank``.

    Args:
        command: The program and its arguments, e.g. ``[sys.executable, "train.py"]``.
        workers: The number of workers (per node with ``hosts``; >= 1).
        ps: The number of parameter servers (per node with ``hosts``).
        chief: Whether to add a chief task (on node 0 with ``hosts``).
        evaluator: Whether to add an evaluator task (on node 0 with ``hosts``).
        host: The address every task listens on, without ``hosts``. Must be
            loopback unless ``allow_external`` is set.
        allow_external: Allow non-loopback addresses in ``host`` or ``hosts``.
            TF's gRPC servers are unauthenticated and execute any graph sent to
            them; a warning is logged.
        ports: One port per task (chief, workers, ps, evaluator); free ports by
            default. Not allowed with ``hosts``, whose base ports fix them.
        env: The base environment of every task; defaults to ``os.environ``.
        output: Where the prefixed output lines go; defaults to ``sys.stdout``.
        timeout: Seconds after which every task is killed, or None.
        max_restarts: Restarts allowed after failures (see :class:`Supervisor`).
            With parameter servers a failed worker is restarted alone, and once
            restarts run out the coordinator goes on with the other workers.
            With ``hosts`` each node restarts only its own tasks.
        nnodes: The number of nodes (machines).
        node_rank: This node's index into ``hosts``; node 0 runs the chief.
        hosts: One ``"host:base_port"`` per node, as a list or a comma-separated
            string; required when ``nnodes > 1``.
        private_network: Run a single-machine cluster on loopback in a private
            network namespace (Linux, root), so that no other host can reach
            its unauthenticated gRPC ports. The tasks then reach nothing
            outside it either (no internet); pass False if they must, and
            firewall the ports. Not used with ``hosts`` or a non-loopback ``host``.

    Returns:
        0 when every chief, worker and evaluator (of this node) exited 0;
        otherwise the failing task's exit code (or 1), 130/143 when interrupted
        by SIGINT/SIGTERM, or 124 on timeout. A node without the chief in a
        parameter-server job ends only when its tasks exit or it is stopped.

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
    single_node = hosts is None and nnodes == 1 and node_rank == 0
    if single_node:
        cluster, local_tasks = _single_node(host, allow_external, workers, ps, chief, evaluator, ports)
    else:
        cluster, local_tasks = _this_node(nnodes, node_rank, hosts, host, allow_external, workers, ps, chief,
                                          evaluator, ports)
    path = (os.environ if env is None else env).get("PATH", os.defpath)
    if shutil.which(command[0], path=path) is None:  # The sandbox helper would only fail later, in the task.
        raise invalid_argument("command", list(command), "a program that exists",
                               note=f"Starting it failed: no executable {command[0]!r} (PATH={path}).")
    loopback = cluster_lib.is_loopback(host) if single_node else all(
        cluster_lib.is_loopback(h) for h, _ in _parse_hosts(hosts, nnodes)[1])
    with Sandbox(private_network=single_node and loopback and bool(private_network)) as sandbox:
        _report_exposure(sandbox, cluster, local_tasks, single_node, loopback, private_network)
        supervisor = Supervisor(command, cluster, env=env, output=sys.stdout if output is None else output,
                                max_restarts=max_restarts, tasks=local_tasks, sandbox=sandbox)
        return supervisor.run(timeout)


def _report_exposure(sandbox: Sandbox, cluster: dict[str, list[str]], local_tasks: Sequence[Task] | None,
                     single_node: bool, loopback: bool, private_network: bool) -> None:
    """Says what protects the tasks' ports, and what to do where nothing does."""
    tasks = local_tasks if local_tasks is not None else [
        Task(t, i) for t in _TASK_ORDER for i in range(len(cluster.get(t, [])))]
    ports = [cluster_lib.split_address(cluster[t.task_type][t.task_id])[1] for t in tasks]
    if sandbox.private_network:
        logger.info("The tasks run in a private network namespace that has only loopback: other hosts cannot "
                    "reach their ports.")
    elif loopback:  # Non-loopback addresses have been warned about already (_require_loopback).
        if not single_node:
            why = "A multi-node cluster (--hosts) uses this host's network"
        elif not private_network:
            why = "private_network=False (--noprivate_network)"
        else:
            why = f"No private network namespace for the tasks ({sandbox.network_problem})"
        logger.warning("%s: ports %s listen on every interface (TF ignores the host in TF_CONFIG), so other hosts "
                       "can reach them, and %s. To prevent that, %s.", why, ", ".join(map(str, ports)),
                       _UNAUTHENTICATED, firewall_advice(ports))
    if not sandbox.pid_namespace:
        logger.warning("No PID namespace for the tasks (%s): a process that a task moves out of its process group "
                       "can outlive a launcher killed with SIGKILL.", sandbox.pid_problem)


def _single_node(host, allow_external, workers, ps, chief, evaluator, ports):
    """The whole cluster on ``host``: (cluster, None)."""
    external = [] if cluster_lib.is_loopback(host) else [host]
    _require_loopback("host", host, external, "a loopback address such as 127.0.0.1 or localhost", allow_external)
    cluster = cluster_lib.make_cluster(workers=workers, ps=ps, chief=chief, evaluator=evaluator,
                                       host=host, ports=ports)
    if ports is not None:
        for i, port in enumerate(ports):
            cluster_lib.check_port_free(host, port, what=f"ports[{i}]")
    return cluster, None


def _this_node(nnodes, node_rank, hosts, host, allow_external, workers, ps, chief, evaluator, ports):
    """A multi-node cluster: (cluster, this node's tasks), with their ports checked."""
    if ports is not None:
        raise invalid_argument("ports", ports, "None when hosts is given",
                               note="Each node's ports follow from its base port in hosts.")
    if host != "127.0.0.1":
        raise invalid_argument("host", host, "the default '127.0.0.1' when hosts is given",
                               note="Each node's host comes from hosts.")
    cluster, local_tasks = node_cluster(nnodes, node_rank, hosts, workers, ps, chief, evaluator=evaluator)
    entries, nodes = _parse_hosts(hosts, nnodes)
    external = [e for e, (h, _) in zip(entries, nodes) if not cluster_lib.is_loopback(h)]
    _require_loopback("hosts", entries, external, "loopback 'host:port' entries such as 127.0.0.1:2222",
                      allow_external)
    my_host = nodes[node_rank][0]
    # TF's gRPC server listens on every interface, so a non-loopback node checks them all.
    bind_host = my_host if cluster_lib.is_loopback(my_host) else ("::" if ":" in my_host else "0.0.0.0")
    for task in local_tasks:
        port = cluster_lib.split_address(cluster[task.task_type][task.task_id])[1]
        cluster_lib.check_port_free(bind_host, port, what=f"TF_CONFIG.cluster.{task.task_type}[{task.task_id}]")
    logger.info("Node %d of %d runs %s; cluster: %s", node_rank, nnodes, ", ".join(map(str, local_tasks)),
                json.dumps(cluster))
    return cluster, local_tasks
