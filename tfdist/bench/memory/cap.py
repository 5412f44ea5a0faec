"""``memory``'s demonstration: under a per-worker memory cap, unsharded runs out, sharded trains.

TF's CPU allocator has no cap of its own, but TF can put the CPU's allocations in a BFC
allocator with a limit: ``TF_CPU_ALLOCATOR_USE_BFC=true`` and ``TF_CPU_BFC_MEM_LIMIT_IN_MB``
(read when TF makes its first CPU allocator, so the tasks are started afresh, not forked
from a preloaded interpreter). The cap starts at unsharded training's measured allocator
peak at the most workers and goes down, in quarters of the gap to ``sharding="gradients"``'s
peak, until unsharded runs out of memory under it (``ResourceExhaustedError``: "OOM when
allocating"; the BFC allocator needs less than the default one's peak). ``"gradients"``
then runs under the same cap and should train (else the result says "not shown"). On a
GPU the same cap is a logical device's ``memory_limit``.
"""

from __future__ import annotations

import logging
from typing import Any

from tfdist.bench.harness import cluster_run

logger = logging.getLogger(__name__)

#: The outcome of a launch under the cap.
TRAINED, OUT_OF_MEMORY = "trained", "out of memory"
_OOM_MARKS = ("OOM when allocating", "ResourceExhaustedError")


def cap_env(cap_mib: int) -> dict[str, str]:
    """The environment that caps each task's CPU allocations at ``cap_mib`` MiB."""
    return {"TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPU_BFC_MEM_LIMIT_IN_MB": str(cap_mib)}


def caps_of(per_workers: dict[str, Any]) -> tuple[int, list[int]] | None:
    """``(workers, caps in MiB)`` at the most workers, from unsharded's whole-run allocator
    peak down towards ``"gradients"``'s in quarters of the gap (TF's BFC allocator, under
    the cap, needs less than the default allocator's peak); None without both figures."""
    n = max(int(k) for k in per_workers)
    entries = per_workers[str(n)]
    high = entries["unsharded"]["worst_worker"]["allocator_peak"]
    low = entries["gradients"]["worst_worker"]["allocator_peak"]
    if high is None or low is None:
        return None
    return n, [int((high - k * max(high - low, 0) / 4) // 2**20) for k in range(4)]


def outcome(error: RuntimeError | None) -> str:
    """What a launch under the cap did: trained, or ran out of memory (other failures raise)."""
    if error is None:
        return TRAINED
    if any(mark in str(error) for mark in _OOM_MARKS):
        return OUT_OF_MEMORY
    raise error


def _under_cap(spec: dict[str, Any], n: int, cap: int, mode: str, sharding: str | None) -> str:
    logger.info("bench memory: %d worker(s), %s, under a cap of %d MiB", n, mode, cap)
    each = {**spec, "sharding": sharding, "weights_path": None, "num_pinned_tasks": n}
    each.update(warmup_steps=1, steps=2, repeats=1)
    try:
        cluster_run.run_tasks(each, workers=n, extra_env=cap_env(cap), preload=False)
    except RuntimeError as error:
        return outcome(error)
    return TRAINED


def demonstrate(spec: dict[str, Any], per_workers: dict[str, Any]) -> dict[str, Any]:
    """Unsharded and ``"gradients"`` under the cap; the result and its summary ratio.

    Returns:
        ``{"cap": {...}, "cap_shown_ratio": 1.0 | 0.0, "words": {...}, "goals": {...}}``
        (empty without an allocator figure).
    """
    found = caps_of(per_workers)
    if found is None:
        return {}
    n, caps = found
    outcomes: dict[str, str] = {}
    for cap in caps:  # the highest cap under which unsharded runs out of memory
        outcomes = {"unsharded": _under_cap(spec, n, cap, "unsharded", None)}
        if outcomes["unsharded"] == OUT_OF_MEMORY:
            outcomes["gradients"] = _under_cap(spec, n, cap, "gradients", "gradients")
            break
    else:
        outcomes["gradients"] = "not run"
    shown = outcomes == {"unsharded": OUT_OF_MEMORY, "gradients": TRAINED}
    key = "cap_shown_ratio"
    return {
        "cap": {
            "workers": n,
            "cap_mib": cap,
            "tried_mib": caps,
            "outcomes": outcomes,
            "shown": shown,
        },
        key: 1.0 if shown else 0.0,
        "words": {
            key: f"{n} workers capped at {cap} MiB each: unsharded {outcomes['unsharded']}, "
            f"gradients {outcomes['gradients']} (1 = shown)"
        },
        "goals": {key: ">= 1"},
    }
