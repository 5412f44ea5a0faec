"""Addresses, ports and socket checks, and the one-machine cluster builder `make_cluster`."""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
from collections.abc import Mapping, Sequence

import portpicker

from tfdist.config import check_non_negative_int, check_positive_int, invalid_argument


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


def join_address(host: str, port: int) -> str:
    """Joins a host and a port: ``"h:1"``, or ``"[::1]:1"`` for an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ``::1`` (no DNS lookup is made).

    Deliberately no DNS: a host counts as loopback only when that is certain without a
    resolver (which may answer differently later, or on another node). Any other name, even
    one that resolves to 127.0.1.1, is treated as external, and ``tfdist launch`` refuses it
    without ``allow_external`` (gRPC is unauthenticated). ``0.0.0.0`` and ``::`` mean every
    interface, so they are not loopback either.
    """
    host = host.strip().strip("[]").rstrip(".").lower()
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    # "::ffff:127.0.0.1" is IPv4 loopback seen through an IPv6 socket; is_loopback misses it.
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
                    what,
                    address,
                    "a free port",
                    note="The port is already in use by another process; "
                    "stop that process or choose another port.",
                ) from None
            raise invalid_argument(
                what,
                address,
                "an address this machine can bind",
                note=f"Binding it failed: {e.strerror or e}.",
            ) from None


def make_cluster(
    *,
    workers: int,
    ps: int = 0,
    chief: bool = False,
    evaluator: bool = False,
    host: str = "127.0.0.1",
    ports: Sequence[int] | None = None,
) -> dict[str, list[str]]:
    """Builds a cluster dict with every task on ``host``.

    This is the cluster of ``tfdist launch`` on one machine and of the in-process
    parameter-server strategy; by default every task is on loopback.

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
    check_non_negative_int("ps", ps)
    if not isinstance(host, str) or not host.strip():
        raise invalid_argument("host", host, "a host name or IP address")
    counts = {
        "chief": int(bool(chief)),
        "worker": workers,
        "ps": ps,
        "evaluator": int(bool(evaluator)),
    }
    it = iter(_task_ports(ports, counts))
    return {t: [join_address(host, next(it)) for _ in range(n)] for t, n in counts.items() if n}


def _task_ports(ports: Sequence[int] | None, counts: Mapping[str, int]) -> list[int]:
    """One port per task: free ones picked, or ``ports`` checked (count, range, distinct)."""
    num_tasks = sum(counts.values())
    if ports is None:
        # portpicker may hand out the same free port twice (nothing holds it between calls).
        picked: list[int] = []
        while len(picked) < num_tasks:
            port = portpicker.pick_unused_port()
            if port not in picked:
                picked.append(port)
        return picked
    ports = list(ports)
    if len(ports) != num_tasks:
        plural = "s" if num_tasks > 1 else ""
        raise invalid_argument(
            "ports", ports, f"{num_tasks} port{plural} (one per task: {_describe(counts)})"
        )
    for i, port in enumerate(ports):
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise invalid_argument(f"ports[{i}]", port, "an integer port in 1..65535")
    if len(set(ports)) != len(ports):
        raise invalid_argument("ports", ports, "distinct ports")
    return ports


def _describe(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {t}" for t, n in counts.items() if n)
