"""Slurm's compact syntaxes: host lists (``node[01-03,07]``) and task counts (``2(x3),1``).

Why not a library: ``scontrol show hostnames`` needs Slurm's client on the PATH and a process per
call (and unit tests without Slurm), and TF's ``slurm_cluster_resolver.expand_hostlist`` is not
public API, imports TensorFlow with it, and rejects names Slurm accepts (``r[1-2]-n[1,3]``,
``b[2-3]x``); see `tfdist.cluster.slurm`. Pure Python, no TensorFlow.
"""

from __future__ import annotations

import re

from tfdist.config import invalid_argument

_HOSTLIST_EXAMPLE = "a Slurm host list like 'node[01-03,07],other'"


def expand_nodelist(nodelist: str, *, name: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Expands Slurm's compact host list, e.g. ``"node[01-03,07],gpu1"``.

    Zero padding is kept (``node[08-10]`` -> node08, node09, node10); several
    bracket groups in one name expand to their product, as Slurm does.

    Args:
        nodelist: The compact host list.
        name: The variable it came from, for the error message.

    Returns:
        The host names, in order (Slurm's order, which is the order of the ranks).

    Raises:
        ValueError: On unbalanced brackets, empty names or bad ranges.
    """
    # Split at the commas outside brackets: "a[1,2],b" -> "a[1,2]", "b".
    items, depth, start = [], 0, 0
    for i, char in enumerate(nodelist + ","):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise invalid_argument(
                name, nodelist, _HOSTLIST_EXAMPLE, note="Its brackets are unbalanced."
            )
        if char == "," and depth == 0:
            items.append(nodelist[start:i].strip())
            start = i + 1
    if depth != 0 or not all(items):
        raise invalid_argument(name, nodelist, _HOSTLIST_EXAMPLE)
    hosts: list[str] = []
    for item in items:
        expanded = [""]
        for literal, bracket in re.findall(r"([^\[\]]*)(\[[^\[\]]*\])?", item):
            if not literal and not bracket:
                continue
            suffixes = (
                _expand_ranges(bracket[1:-1], name=name, nodelist=nodelist) if bracket else [""]
            )
            expanded = [prefix + literal + s for prefix in expanded for s in suffixes]
        hosts.extend(expanded)
    return hosts


def _expand_ranges(ranges: str, *, name: str, nodelist: str) -> list[str]:
    out = []
    for part in ranges.split(","):
        match = re.fullmatch(r"\s*([0-9]+)(?:-([0-9]+))?\s*", part)
        if not match or (match.group(2) and int(match.group(2)) < int(match.group(1))):
            raise invalid_argument(
                name, nodelist, _HOSTLIST_EXAMPLE, note=f"Bad range {part!r} in brackets."
            )
        first, last = match.group(1), match.group(2) or match.group(1)
        # The width of the first number is the padding: "08-10" -> 08, 09, 10.
        out.extend(str(n).zfill(len(first)) for n in range(int(first), int(last) + 1))
    return out


def expand_tasks_per_node(spec: str, *, name: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Expands Slurm's tasks-per-node syntax, e.g. ``"2(x3),1"`` -> [2, 2, 2, 1].

    Raises:
        ValueError: If ``spec`` does not follow that syntax.
    """
    counts = []
    for part in spec.split(","):
        match = re.fullmatch(r"\s*([0-9]+)(?:\(x([0-9]+)\))?\s*", part)
        if not match or int(match.group(1)) < 1 or match.group(2) == "0":
            raise invalid_argument(name, spec, "task counts like '2(x3),1' (each count >= 1)")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts
