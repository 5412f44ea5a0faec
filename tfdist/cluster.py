"""TF_CONFIG and Slurm environments -> a validated cluster spec and this task.

Pure Python (no TensorFlow import), so the launcher and the CLI stay fast::

    info = tfdist.cluster.from_environment()   # None outside a cluster
    if info is not None and info.is_chief:
        ...

Without TF_CONFIG, a Slurm job step gives the cluster (:mod:`tfdist.slurm_cluster`).
Every problem raises one ``ValueError`` worded by
:func:`tfdist.config.invalid_argument`, naming the offending field, e.g.
``TF_CONFIG.cluster.worker[1]``.
"""
from __future__ import annotations

import copy
import errno
import ipaddress
import json
import logging
import os
import re
import socket
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import portpicker

from tfdist.config import check_positive_int, invalid_argument

logger = logging.getLogger(__name__)

VALID_TASK_TYPES = ("chief", "worker", "ps", "evaluator")
_TASK_EXAMPLE = "a dict like {'type': 'worker', 'index': 0}"
def task_label(task_type: str, task_id: int) -> str:
    """The one way tfdist names a task in logs and temporary paths: ``"worker:1"``."""
    return f"{task_type}:{task_id}"


def is_chief_task(task_type: str | None, task_id: int, *, cluster_has_chief: bool) -> bool:
    """True for the chief, or for worker 0 of a cluster without a chief (TF's rule)."""
    if task_type == "chief":
        return True
    return task_type == "worker" and int(task_id) == 0 and not cluster_has_chief


class _Missing:
    """Stands in for a key that is absent, so the error reads ``name=<missing>``."""

    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


@dataclass(frozen=True)
class ClusterInfo:
    """The cluster and this process's place in it, as TF_CONFIG describes them.

    Attributes:
        cluster: Task type -> list of ``"host:port"`` addresses.
        task_type: This task's type: ``chief``, ``worker``, ``ps`` or ``evaluator``.
        task_id: This task's index within ``cluster[task_type]``.
        rpc_layer: The RPC protocol TensorFlow uses between tasks.
    """

    cluster: dict[str, list[str]]
    task_type: str
    task_id: int
    rpc_layer: str = "grpc"

    @property
    def is_chief(self) -> bool:
        """True for the chief, or for worker 0 when the cluster has no chief."""
        return is_chief_task(self.task_type, self.task_id, cluster_has_chief=bool(self.cluster.get("chief")))

    @property
    def num_workers(self) -> int:
        """The number of training workers: chief plus workers."""
        return len(self.cluster.get("chief", [])) + len(self.cluster.get("worker", []))

    @property
    def address(self) -> str:
        """This task's ``host:port``; ``""`` for an evaluator outside the cluster."""
        addresses = self.cluster.get(self.task_type, [])
        return addresses[self.task_id] if self.task_id < len(addresses) else ""

    def to_tf_config(self) -> dict:
        """Returns the TF_CONFIG dict (``json.dumps`` it for the environment)."""
        return {
            "cluster": copy.deepcopy(self.cluster),
            "task": {"type": self.task_type, "index": self.task_id},
            "rpc_layer": self.rpc_layer,
        }


def parse_tf_config(raw: str | dict | None) -> ClusterInfo | None:
    """Parses and validates TF_CONFIG.

    Args:
        raw: The TF_CONFIG JSON string, an already-decoded dict, or None.

    Returns:
        The validated :class:`ClusterInfo`, or None when ``raw`` is None or empty.

    Raises:
        ValueError: If TF_CONFIG is malformed; the message names the bad field.
    """
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if isinstance(raw, str):
        try:
            config = json.loads(raw)
        except json.JSONDecodeError as e:
            raise invalid_argument(
                "TF_CONFIG", raw, "a JSON object",
                note=f"JSON error: {e.msg} at line {e.lineno} column {e.colno} (char {e.pos}).") from None
    elif isinstance(raw, dict):
        config = raw
    else:
        raise invalid_argument("TF_CONFIG", raw, "a JSON string, a dict or None")
    if not isinstance(config, dict):
        raise invalid_argument("TF_CONFIG", config, "a JSON object with keys 'cluster' and 'task'")

    cluster = _validate_cluster(config.get("cluster", _MISSING))
    task = config.get("task", _MISSING)
    if not isinstance(task, dict):
        raise invalid_argument("TF_CONFIG.task", task, _TASK_EXAMPLE)
    task_type = task.get("type", _MISSING)
    if not isinstance(task_type, str) or (task_type not in cluster and task_type != "evaluator"):
        raise invalid_argument(
            "TF_CONFIG.task.type", task_type, sorted(cluster),
            note="The task type must be one of the task types in TF_CONFIG.cluster.")
    task_id = task.get("index", _MISSING)
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        raise invalid_argument("TF_CONFIG.task.index", task_id, "an integer")
    size = len(cluster.get(task_type, [])) or 1  # An evaluator outside the cluster is one task.
    if not 0 <= task_id < size:
        raise invalid_argument(
            "TF_CONFIG.task.index", task_id, f"an integer in the range [0, {size - 1}]",
            note=f"TF_CONFIG.cluster.{task_type} has {size} task(s).")
    rpc_layer = config.get("rpc_layer", "grpc")
    if not isinstance(rpc_layer, str) or not rpc_layer:
        raise invalid_argument("TF_CONFIG.rpc_layer", rpc_layer, "a non-empty string such as 'grpc'")
    return ClusterInfo(cluster=cluster, task_type=task_type, task_id=task_id, rpc_layer=rpc_layer)


def _validate_cluster(cluster: Any) -> dict[str, list[str]]:
    """Checks TF_CONFIG.cluster and returns a copy of it."""
    if not isinstance(cluster, dict) or not cluster:
        raise invalid_argument(
            "TF_CONFIG.cluster", cluster,
            "a non-empty dict mapping task types to lists of 'host:port' addresses")
    unknown = sorted(str(t) for t in cluster if t not in VALID_TASK_TYPES)
    if unknown:
        raise invalid_argument(
            "TF_CONFIG.cluster", cluster, "task types from: " + ", ".join(VALID_TASK_TYPES),
            note=f"Unknown task type(s): {', '.join(unknown)}.")
    seen: dict[str, str] = {}
    result = {}
    for task_type, addresses in cluster.items():
        name = f"TF_CONFIG.cluster.{task_type}"
        if not isinstance(addresses, list) or not addresses:
            raise invalid_argument(name, addresses, "a non-empty list of 'host:port' strings")
        if task_type == "chief" and len(addresses) > 1:
            raise invalid_argument(name, addresses, "a list with exactly one address",
                                   note="A cluster has at most one chief.")
        for i, address in enumerate(addresses):
            task_name = f"{task_type}[{i}]"
            _check_address(f"TF_CONFIG.cluster.{task_name}", address)
            if address in seen:
                raise invalid_argument(
                    f"TF_CONFIG.cluster.{task_name}", address, "an address used by exactly one task",
                    note=f"TF_CONFIG.cluster.{seen[address]} has the same address.")
            seen[address] = task_name
        result[task_type] = list(addresses)
    return result


def split_address(address: str) -> tuple[str, int] | None:
    """Splits ``"host:port"`` (``"[v6]:port"`` for IPv6) into host and port; None if malformed."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not re.fullmatch(r"[0-9]+", port):
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        return None  # An IPv6 host needs brackets: "[::1]:2222".
    if not host or any(c.isspace() for c in host) or not 1 <= int(port) <= 65535:
        return None
    return host, int(port)


def _check_address(name: str, address: Any) -> None:
    if not isinstance(address, str) or split_address(address) is None:
        raise invalid_argument(
            name, address, "a 'host:port' string with an integer port in 1..65535",
            note="Write IPv6 hosts in brackets, e.g. '[::1]:2222'.")


def from_environment(environ: Mapping[str, str] | None = None) -> ClusterInfo | None:
    """Reads the cluster from TF_CONFIG, or else from a Slurm job step.

    A Slurm job step is a process ``srun`` started (SLURM_JOB_ID and
    SLURM_STEP_ID are set). Not clusters, so None: an interactive
    ``srun --pty`` shell (SLURM_PTY_PORT is set), and a one-task allocation's
    batch script or ``salloc`` shell.

    Args:
        environ: The environment to read; defaults to ``os.environ``.

    Returns:
        The :class:`ClusterInfo`, or None outside a cluster.

    Raises:
        ValueError: If the variables found are malformed, or this process runs
            in a Slurm allocation of several tasks but outside ``srun``.
    """
    environ = os.environ if environ is None else environ
    raw = environ.get("TF_CONFIG", "")
    if raw.strip():
        return parse_tf_config(raw)
    from tfdist import slurm_cluster  # Imported here: it builds on this module.

    return slurm_cluster.detect(environ)


# Slurm's names, kept importable from here (e.g. ``from tfdist.cluster import from_slurm``).
_SLURM_NAMES = ("SLURM_PORT_BASE", "SLURM_PORTS_PER_JOB", "SLURM_PORT_BLOCKS", "SLURM_ROLES_VAR", "slurm_port_base",
                "slurm_roles", "from_slurm", "expand_nodelist", "expand_tasks_per_node")


def __getattr__(name: str) -> Any:
    if name in _SLURM_NAMES:
        from tfdist import slurm_cluster

        return getattr(slurm_cluster, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_cluster(*, workers: int, ps: int = 0, chief: bool = False, evaluator: bool = False,
                 host: str = "127.0.0.1", ports: Sequence[int] | None = None) -> dict[str, list[str]]:
    """Builds a cluster dict with every task on ``host``.

    Args:
        workers: The number of workers (>= 1).
        ps: The number of parameter servers (>= 0).
        chief: Whether to add a chief.
        evaluator: Whether to add an evaluator.
        host: The host of every task.
        ports: One port per task, in the order chief, workers, ps, evaluator.
            By default free ports are picked with ``portpicker``.

    Returns:
        Task type -> list of ``"host:port"``, e.g. ``{"worker": ["127.0.0.1:15001", ...]}``.

    Raises:
        ValueError: On bad counts, or ports of the wrong number, range or duplicated.
    """
    check_positive_int("workers", workers)
    if isinstance(ps, bool) or not isinstance(ps, int) or ps < 0:
        raise invalid_argument("ps", ps, "a non-negative integer")
    if not isinstance(host, str) or not host.strip():
        raise invalid_argument("host", host, "a host name or IP address")
    counts = {"chief": int(bool(chief)), "worker": workers, "ps": ps, "evaluator": int(bool(evaluator))}
    num_tasks = sum(counts.values())
    if ports is None:
        picked: list[int] = []
        while len(picked) < num_tasks:
            port = portpicker.pick_unused_port()
            if port not in picked:
                picked.append(port)
        ports = picked
    else:
        ports = list(ports)
        if len(ports) != num_tasks:
            raise invalid_argument("ports", ports, f"{num_tasks} port{'s' if num_tasks > 1 else ''} (one per task: {_describe(counts)})")
        for i, port in enumerate(ports):
            if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
                raise invalid_argument(f"ports[{i}]", port, "an integer port in 1..65535")
        if len(set(ports)) != len(ports):
            raise invalid_argument("ports", ports, "distinct ports")
    it = iter(ports)
    return {t: [join_address(host, next(it)) for _ in range(n)] for t, n in counts.items() if n}


def _describe(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {t}" for t, n in counts.items() if n)


def join_address(host: str, port: int) -> str:
    """Joins a host and a port: ``"h:1"``, or ``"[::1]:1"`` for an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ``::1`` (no DNS lookup is made)."""
    host = host.strip().strip("[]").rstrip(".").lower()
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or bool(mapped and mapped.is_loopback)


def check_port_free(host: str, port: int, *, what: str) -> None:
    """Raises if ``host:port`` cannot be bound as a server would bind it.

    Uses ``SO_REUSEADDR`` like gRPC does, so a port whose previous owner just
    exited (TIME_WAIT, e.g. a restarted task) counts as free, while a port
    another process holds or listens on does not.

    Args:
        host: The local address to bind.
        port: The port to bind.
        what: The field the address came from, e.g. ``TF_CONFIG.cluster.worker[0]``.

    Raises:
        ValueError: If the port is in use, or the address is not one of this machine's.
    """
    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    address = join_address(bare, port)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((bare, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise invalid_argument(
                    what, address, "a free port",
                    note="The port is already in use by another process; "
                         "stop that process or choose another port.") from None
            raise invalid_argument(what, address, "an address this machine can bind",
                                   note=f"Binding it failed: {e.strerror or e}.") from None
