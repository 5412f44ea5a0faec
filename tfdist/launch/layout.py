"""Where a launch's tasks listen: one machine's cluster, or a layout over ``--hosts`` nodes.

Every launcher of a multi-node job computes the same layout from the same
arguments (`node_cluster`), so the nodes agree on the cluster without
talking to each other. Addresses other than loopback are refused unless
allowed (`require_loopback`): TF's gRPC servers are unauthenticated.
No TensorFlow is imported here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from tfdist.cluster import check_port_free, is_loopback, join_address, make_cluster, split_address
from tfdist.config import check_non_negative_int, check_positive_int, invalid_argument
from tfdist.launch.isolation import UNAUTHENTICATED
from tfdist.launch.tasks import TASK_ORDER, LaunchSpec, Task

logger = logging.getLogger(__name__)


def node_cluster(
    nnodes: int,
    node_rank: int,
    hosts: Sequence[str] | str | None,
    workers: int,
    ps: int = 0,
    chief: bool = False,
    *,
    evaluator: bool = False,
) -> tuple[dict[str, list[str]], list[Task]]:
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
        addresses, and the `Task` objects this node runs.

    Raises:
        ValueError: On bad counts, a ``node_rank`` out of range, a ``hosts`` entry
            that is malformed or repeated, or nodes on one host whose port ranges overlap.
    """
    check_positive_int("nnodes", nnodes)
    if isinstance(node_rank, bool) or not isinstance(node_rank, int) or not 0 <= node_rank < nnodes:
        raise invalid_argument(
            "node_rank",
            node_rank,
            f"an integer in the range [0, {nnodes - 1}]",
            note=f"Nodes are numbered from 0 and nnodes={nnodes}.",
        )
    check_positive_int("workers", workers)
    check_non_negative_int("ps", ps)
    entries, nodes = parse_hosts(hosts, nnodes)
    cluster: dict[str, list[str]] = {t: [] for t in TASK_ORDER}
    owners: dict[str, int] = {}
    local_tasks = []
    for k, (host, base_port) in enumerate(nodes):
        # Dict order is port order: workers, then ps, then node 0's chief and evaluator.
        counts = {
            "worker": workers,
            "ps": ps,
            "chief": int(k == 0 and bool(chief)),
            "evaluator": int(k == 0 and bool(evaluator)),
        }
        num_tasks = sum(counts.values())
        if base_port + num_tasks - 1 > 65535:
            raise invalid_argument(
                f"hosts[{k}]",
                entries[k],
                f"a base port <= {65536 - num_tasks}",
                note=f"Node {k} runs {num_tasks} task(s) on consecutive ports from its base port.",
            )
        port = base_port
        for task_type, count in counts.items():
            for _ in range(count):
                address = join_address(host, port)
                if address.lower() in owners:
                    raise invalid_argument(
                        "hosts",
                        entries,
                        "nodes whose port ranges do not overlap",
                        note=f"Nodes {owners[address.lower()]} and {k} would both use {address}: "
                        f"a node uses {num_tasks} consecutive ports from its base port, so "
                        f"base ports on one host must be at least that far apart.",
                    )
                owners[address.lower()] = k
                if k == node_rank:
                    local_tasks.append(Task(task_type, len(cluster[task_type])))
                cluster[task_type].append(address)
                port += 1
    local_tasks.sort(key=lambda task: TASK_ORDER.index(task.task_type))
    return {t: addresses for t, addresses in cluster.items() if addresses}, local_tasks


def parse_hosts(
    hosts: Sequence[str] | str | None, nnodes: int
) -> tuple[list[str], list[tuple[str, int]]]:
    """Checks ``hosts`` and returns its entries and their (host, base_port) pairs.

    Raises:
        ValueError: Unless ``hosts`` has ``nnodes`` distinct ``"host:port"`` entries.
    """
    expected = (
        f"{nnodes} 'host:port' entries, one per node (nnodes={nnodes}), e.g. 'h1:2222,h2:2222'"
    )
    entries = hosts.split(",") if isinstance(hosts, str) else hosts
    if not isinstance(entries, (list, tuple)) or not all(isinstance(e, str) for e in entries):
        raise invalid_argument(
            "hosts",
            hosts,
            expected,
            note="More than one node (or node_rank > 0) needs to know where every node is."
            if hosts is None
            else "",
        )
    entries = [e.strip() for e in entries]
    if len(entries) != nnodes:
        raise invalid_argument("hosts", hosts, expected, note=f"It has {len(entries)}.")
    nodes: list[tuple[str, int]] = []
    seen: dict[tuple[str, int], int] = {}
    for i, entry in enumerate(entries):
        parsed = split_address(entry)
        if parsed is None:
            raise invalid_argument(
                f"hosts[{i}]",
                entry,
                "a 'host:port' string with an integer port in 1..65535",
                note="The port is that of the node's first task. Write IPv6 hosts in brackets, "
                "e.g. '[::1]:2222'.",
            )
        key = (parsed[0].lower(), parsed[1])
        if key in seen:
            raise invalid_argument(
                f"hosts[{i}]",
                entry,
                "a 'host:port' that no other node uses",
                note=f"hosts[{seen[key]}] is the same.",
            )
        seen[key] = i
        nodes.append(parsed)
    return entries, nodes


def require_loopback(
    name: str, value: object, external: Sequence[str], expected: str, allow_external: bool
) -> None:
    """Refuses non-loopback addresses unless ``allow_external``, and then warns."""
    if not external:
        return
    if not allow_external:
        raise invalid_argument(
            name,
            value,
            expected,
            note=f"Not loopback: {', '.join(external)}. {UNAUTHENTICATED}; pass --allow_external "
            f"(allow_external=True) to use other addresses anyway, on a trusted, firewalled "
            f"network only.",
        )
    logger.warning(
        "Using %s, which is not loopback: %s. Use it only on a trusted, firewalled network.",
        ", ".join(external),
        UNAUTHENTICATED,
    )


def single_node_cluster(spec: LaunchSpec) -> dict[str, list[str]]:
    """The whole cluster on ``spec.host`` (every task runs here), with given ports checked free."""
    host, ports = spec.host, spec.ports
    external = [] if is_loopback(host) else [host]
    require_loopback(
        "host",
        host,
        external,
        "a loopback address such as 127.0.0.1 or localhost",
        spec.allow_external,
    )
    cluster = make_cluster(
        workers=spec.workers,
        ps=spec.ps,
        chief=spec.chief,
        evaluator=spec.evaluator,
        host=host,
        ports=ports,
    )
    if ports is not None:
        for i, port in enumerate(ports):
            check_port_free(host, port, what=f"ports[{i}]")
    return cluster


def multi_node_cluster(spec: LaunchSpec) -> tuple[dict[str, list[str]], list[Task]]:
    """A multi-node cluster: (cluster, this node's tasks), with this node's ports checked free.

    ``spec.host`` and ``spec.ports`` are the single-node arguments, refused here unless
    left at their defaults: the layout fixes both.
    """
    nnodes, node_rank, hosts = spec.nnodes, spec.node_rank, spec.hosts
    if spec.ports is not None:
        raise invalid_argument(
            "ports",
            spec.ports,
            "None when hosts is given",
            note="Each node's ports follow from its base port in hosts.",
        )
    if spec.host != "127.0.0.1":
        raise invalid_argument(
            "host",
            spec.host,
            "the default '127.0.0.1' when hosts is given",
            note="Each node's host comes from hosts.",
        )
    cluster, local_tasks = node_cluster(
        nnodes, node_rank, hosts, spec.workers, spec.ps, spec.chief, evaluator=spec.evaluator
    )
    entries, nodes = parse_hosts(hosts, nnodes)
    external = [e for e, (h, _) in zip(entries, nodes) if not is_loopback(h)]
    require_loopback(
        "hosts",
        entries,
        external,
        "loopback 'host:port' entries such as 127.0.0.1:2222",
        spec.allow_external,
    )
    my_host = nodes[node_rank][0]
    # TF's gRPC server listens on every interface, so a non-loopback node checks them all.
    bind_host = my_host if is_loopback(my_host) else ("::" if ":" in my_host else "0.0.0.0")
    for task in local_tasks:
        port = split_address(cluster[task.task_type][task.task_id])[1]
        check_port_free(bind_host, port, what=f"TF_CONFIG.cluster.{task.task_type}[{task.task_id}]")
    logger.info(
        "Node %d of %d runs %s; cluster: %s",
        node_rank,
        nnodes,
        ", ".join(map(str, local_tasks)),
        json.dumps(cluster),
    )
    return cluster, local_tasks
