"""Streaming DiLoCo's fragments: the averaged variables cut into ``K`` pieces, synced in turn.

With ``LocalSGDOptions(sync_every=H, fragments=K)`` (Douillard et al. 2025, "Streaming DiLoCo")
the trainable variables, in model order (``model.trainable_variables``), are cut into ``K``
contiguous fragments, and each float non-trainable statistic (BatchNorm's moving mean and
variance) goes with the trainable variable just before it in ``model.weights``: its own
layer's (``gamma``, ``beta``) when the layer has any, else the layer before it's (the first
fragment for a statistic before every trainable variable).

**Balanced by bytes:** each trainable variable weighs its bytes plus those of the statistics
that go with it, and the cut is the one whose largest fragment is smallest (the linear
partition: a binary search on that largest size, each candidate packed greedily from the
first variable), every fragment at least one variable. A single variable larger than
``1/K`` of the model (an embedding) makes its fragment the largest; nothing splits a variable.

**The schedule:** fragment ``j`` syncs at the updates ``t`` (counted by
``optimizer.iterations``) where ``t % H == ((j + 1) * H // K) % H``: one fragment every
``H / K`` updates, each every ``H`` updates, the last fragment at multiples of ``H`` (with
``K = 1`` the one fragment syncs there: plain local SGD or DiLoCo). A sync carries about
``1/K`` of the model's bytes and the bytes per update stay ``model_bytes / H``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import tensorflow as tf

from tfdist.config import invalid_argument


@dataclasses.dataclass(frozen=True)
class Fragment:
    """One fragment: its place in the schedule and the variables it syncs.

    Attributes:
        index: ``j``, in model order.
        offset: ``t % H`` at the updates where it syncs.
        parameters: Indices into the state's trainable variables (contiguous).
        statistics: Indices into the state's averaged statistics.
        bytes: The bytes it averages at each sync (parameters and statistics).
    """

    index: int
    offset: int
    parameters: tuple[int, ...]
    statistics: tuple[int, ...]
    bytes: int


def offset(index: int, fragments: int, sync_every: int) -> int:
    """``t % H`` at the updates where fragment ``index`` of ``fragments`` syncs."""
    return ((index + 1) * sync_every // fragments) % sync_every


def split(
    model: Any, parameters: list[Any], statistics: list[Any], fragments: int, sync_every: int
) -> list[Fragment]:
    """The ``fragments`` fragments of ``parameters`` and ``statistics`` (see the module).

    Raises:
        ValueError: Naming ``fragments``, when there are fewer trainable variables.
    """
    if fragments > max(len(parameters), 1):
        raise too_many(fragments, len(parameters))
    owners = _owners(model, parameters, statistics)
    own_bytes = [_bytes(v) for v in parameters]
    statistic_bytes = [_bytes(v) for v in statistics]
    sizes = list(own_bytes)  # each trainable variable's, with its statistics'
    for k, owner in enumerate(owners):
        if sizes:  # no trainable variable: one fragment (fragments=1), its statistics only
            sizes[owner] += statistic_bytes[k]
    bounds = [0, len(sizes)] if fragments == 1 else cuts(sizes, fragments)
    out = []
    for j in range(fragments):
        members = range(bounds[j], bounds[j + 1])
        own = tuple(k for k, o in enumerate(owners) if fragments == 1 or o in members)
        out.append(
            Fragment(
                index=j,
                offset=offset(j, fragments, sync_every),
                parameters=tuple(members),
                statistics=own,
                bytes=sum(own_bytes[i] for i in members) + sum(statistic_bytes[k] for k in own),
            )
        )
    return out


def too_many(fragments: int, variables: int) -> ValueError:
    """The refusal of more fragments than trainable variables."""
    return invalid_argument(
        "fragments",
        fragments,
        f"at most the model's {variables} trainable variables (each fragment holds at least one)",
    )


def pending(fragments: list[Fragment], iterations: int, sync_every: int) -> list[Fragment]:
    """The fragments mid-round after ``iterations`` updates: all but the one that synced at
    this very update, if one did (what a fit's end or an elastic resume syncs)."""
    return [f for f in fragments if iterations % sync_every != f.offset]


def _owners(model: Any, parameters: list[Any], statistics: list[Any]) -> list[int]:
    """For each statistic, the index of the trainable variable just before it in
    ``model.weights`` (its layer's, or the layer's before), 0 when none is."""
    index = {id(v): i for i, v in enumerate(parameters)}
    wanted = {id(v) for v in statistics}
    last, seen = 0, {}
    for v in model.weights:
        if id(v) in index:
            last = index[id(v)]
        elif id(v) in wanted:
            seen.setdefault(id(v), last)
    return [seen.get(id(v), 0) for v in statistics]


def _bytes(variable: Any) -> int:
    return math.prod(tuple(variable.shape)) * tf.as_dtype(variable.dtype).size


def _parts(sizes: list[int], cap: int) -> int:
    """How many contiguous parts of at most ``cap`` bytes a greedy packing needs."""
    parts, total = 1, 0
    for size in sizes:
        if total + size > cap:
            parts, total = parts + 1, 0
        total += size
    return parts


def cuts(sizes: list[int], k: int) -> list[int]:
    """The ``k + 1`` bounds of the cut whose largest part is smallest, each part non-empty."""
    n = len(sizes)
    low, high = max(sizes), sum(sizes)
    while low < high:  # the smallest cap a greedy packing fits in k parts
        middle = (low + high) // 2
        if _parts(sizes, middle) <= k:
            high = middle
        else:
            low = middle + 1
    bounds, start = [0], 0
    for j in range(k - 1):
        end, total = start + 1, sizes[start]
        # Greedy up to the cap, leaving one variable for each later part.
        while end < n - (k - 1 - j) and total + sizes[end] <= low:
            total, end = total + sizes[end], end + 1
        bounds.append(end)
        start = end
    return [*bounds, n]
