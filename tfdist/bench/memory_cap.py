"""``memory``'s demonstration: under a per-worker memory cap, unsharded runs out, sharded trains.

TF's CPU allocator has no cap of its own, but TF can put the CPU's allocations in a BFC
allocator with a limit: ``TF_CPU_ALLOCATOR_USE_BFC=true`` and ``TF_CPU_BFC_MEM_LIMIT_IN_MB``
(read when TF makes its first CPU allocator, so the tasks are started afresh, not forked
from a preloaded interpreter). The cap is unsharded training's measured allocator peak at
the most workers: unsharded must run out of memory under it (``ResourceExhaustedError``:
"OOM when allocating"); ``sharding="gradients"``, whose peak is lower, should train, unless
the BFC allocator's own rounding and fragmentation take more than the gap (then the result
says "not shown"). On a GPU the same cap is a logical device's ``memory_limit``.
"""

from __future__ import annotations

import logging
from typing import Any

from tfdist.bench import cluster_run

logger = logging.getLogger(__name__)

#: The outcome of a launch under the cap.
TRAINED, OUT_OF_MEMORY = "trained", "out of memory"
_OOM_MARKS = ("OOM when allocating", "ResourceExhaustedError")


def cap_env(cap_mib: int) -> dict[str, str]:
    """The environment that caps each task's CPU allocations at ``cap_mib`` MiB."""
    return {"TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPU_BFC_MEM_LIMIT_IN_MB": str(cap_mib)}


def cap_of(per_workers: dict[str, Any]) -> tuple[int, int] | None:
    """``(workers, cap in MiB)``: unsharded's whole-run allocator peak at the most workers
    (rounded down), or None where the allocator gave no figure."""
    n = max(int(k) for k in per_workers)
    peak = per_workers[str(n)]["unsharded"]["worst_worker"]["allocator_peak"]
    return None if peak is None else (n, int(peak // 2**20))


def outcome(error: RuntimeError | None) -> str:
    """What a launch under the cap did: trained, or ran out of memory (other failures raise)."""
    if error is None:
        return TRAINED
    if any(mark in str(error) for mark in _OOM_MARKS):
        return OUT_OF_MEMORY
    raise error


def demonstrate(spec: dict[str, Any], per_workers: dict[str, Any]) -> dict[str, Any]:
    """Unsharded and ``"gradients"`` under the cap; the result and its summary ratio.

    Returns:
        ``{"cap": {...}, "cap_shown_ratio": 1.0 | 0.0, "words": {...}, "goals": {...}}``
        (empty without an allocator figure).
    """
    found = cap_of(per_workers)
    if found is None:
        return {}
    n, cap = found
    outcomes = {}
    for mode, sharding in (("unsharded", None), ("gradients", "gradients")):
        logger.info("bench memory: %d worker(s), %s, under a cap of %d MiB", n, mode, cap)
        each = {**spec, "sharding": sharding, "weights_path": None, "num_pinned_tasks": n}
        each.update(warmup_steps=1, steps=2, repeats=1)
        try:
            cluster_run.run_tasks(each, workers=n, extra_env=cap_env(cap), preload=False)
            error = None
        except RuntimeError as e:
            error = e
        outcomes[mode] = outcome(error)
    shown = outcomes == {"unsharded": OUT_OF_MEMORY, "gradients": TRAINED}
    key = "cap_shown_ratio"
    return {
        "cap": {"workers": n, "cap_mib": cap, "outcomes": outcomes, "shown": shown},
        key: 1.0 if shown else 0.0,
        "words": {
            key: f"{n} workers capped at {cap} MiB each: unsharded {outcomes['unsharded']}, "
            f"gradients {outcomes['gradients']} (1 = shown)"
        },
        "goals": {key: ">= 1"},
    }
