"""``memory``'s demonstrations: under a per-worker memory cap, the modes that hold more run out
of memory and a sharded mode trains.

TF's CPU allocator has no cap of its own, but TF can put the CPU's allocations in a BFC
allocator with a limit: ``TF_CPU_ALLOCATOR_USE_BFC=true`` and ``TF_CPU_BFC_MEM_LIMIT_IN_MB``
(read when TF makes its first CPU allocator, so the tasks are started afresh, not forked
from a preloaded interpreter). Two demonstrations per workload, at the most workers
(`DEMOS`): ``"gradients"`` trains where unsharded runs out, and ``"parameters"`` trains where
``"gradients"`` and unsharded both run out. Each cap starts at the measured allocator peak of
the mode that should run out and holds least (unsharded; ``"gradients"``) and goes down, in
quarters of the gap to the peak of the mode that should train, until that mode runs out of
memory under it (``ResourceExhaustedError``: "OOM when allocating"; the BFC allocator needs
less than the default one's peak). The other modes then run under the same cap: those that
hold more should run out too, the sharded one should train (else the result says "not
shown"). On a GPU the same cap is a logical device's ``memory_limit``.
"""

from __future__ import annotations

import logging
from typing import Any

from tfdist.bench.harness import cluster_run

logger = logging.getLogger(__name__)

#: The outcome of a launch under the cap. ``FAILED``: it stopped without TF's out-of-memory
#: error (a task killed by a signal: TF's BFC allocator, out of memory under a cap, has
#: crashed a collective's worker with SIGSEGV on the MLP), recorded rather than raised, so that
#: the bench's other results are kept; it does not count as shown.
TRAINED, OUT_OF_MEMORY, FAILED = "trained", "out of memory", "failed without an OOM error"
_OOM_MARKS = ("OOM when allocating", "ResourceExhaustedError")
#: Each demonstration: the mode that should train under the cap, and those that should run out
#: of memory under it, the one holding least first (the cap goes down until it runs out).
DEMOS = {"gradients": ("unsharded",), "parameters": ("gradients", "unsharded")}
#: The ``sharding=`` of each mode the demonstrations launch.
SHARDING = {"unsharded": None, "gradients": "gradients", "parameters": "parameters"}


def cap_env(cap_mib: int) -> dict[str, str]:
    """The environment that caps each task's CPU allocations at ``cap_mib`` MiB."""
    return {"TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPU_BFC_MEM_LIMIT_IN_MB": str(cap_mib)}


def caps_of(
    per_workers: dict[str, Any], high_mode: str = "unsharded", low_mode: str = "gradients"
) -> tuple[int, list[int]] | None:
    """``(workers, caps in MiB)`` at the most workers, from ``high_mode``'s whole-run allocator
    peak down towards ``low_mode``'s in quarters of the gap (TF's BFC allocator, under the
    cap, needs less than the default allocator's peak); None without both figures."""
    n = max(int(k) for k in per_workers)
    entries = per_workers[str(n)]
    if high_mode not in entries or low_mode not in entries:
        return None
    high = entries[high_mode]["worst_worker"]["allocator_peak"]
    low = entries[low_mode]["worst_worker"]["allocator_peak"]
    if high is None or low is None:
        return None
    return n, [int((high - k * max(high - low, 0) / 4) // 2**20) for k in range(4)]


def outcome(error: RuntimeError | None) -> str:
    """What a launch under the cap did: trained, ran out of memory, or failed otherwise."""
    if error is None:
        return TRAINED
    if any(mark in str(error) for mark in _OOM_MARKS):
        return OUT_OF_MEMORY
    logger.warning("bench memory: a launch under the cap failed: %s", error)
    return FAILED


def _under_cap(spec: dict[str, Any], n: int, cap: int, mode: str) -> str:
    logger.info(
        "bench memory: %s, %d worker(s), %s, under a cap of %d MiB",
        *(spec.get("workload", "mlp"), n, mode, cap),
    )
    each = {**spec, "sharding": SHARDING[mode], "weights_path": None, "num_pinned_tasks": n}
    each.update(warmup_steps=1, steps=2, repeats=1)
    try:
        cluster_run.run_tasks(each, workers=n, extra_env=cap_env(cap), preload=False)
    except RuntimeError as error:
        return outcome(error)
    return TRAINED


def demonstrate_one(spec: dict[str, Any], per_workers: dict[str, Any], trained: str) -> Any:
    """One demonstration (`DEMOS`): ``(n, cap, caps tried, outcomes)``, or None without an
    allocator figure."""
    beaten = DEMOS[trained]
    found = caps_of(per_workers, beaten[0], trained)
    if found is None:
        return None
    n, caps = found
    outcomes: dict[str, str] = {}
    for cap in caps:  # the highest cap under which the mode holding least of `beaten` runs out
        outcomes = {beaten[0]: _under_cap(spec, n, cap, beaten[0])}
        if outcomes[beaten[0]] != TRAINED:
            for mode in (*beaten[1:], trained):
                outcomes[mode] = _under_cap(spec, n, cap, mode)
            break
    else:
        outcomes.update({mode: "not run" for mode in (*beaten[1:], trained)})
    return n, cap, caps, outcomes


def demonstrate(spec: dict[str, Any], per_workers: dict[str, Any], workload: str) -> dict:
    """Each demonstration of `DEMOS` on one workload; the results and their summary ratios.

    Returns:
        ``{"cap": {trained mode: {...}}, "<workload>_<mode>_cap_shown_ratio": 1.0 | 0.0,
        "words": {...}, "goals": {...}}`` (no demonstration without an allocator figure).
    """
    out: dict[str, Any] = {"cap": {}, "words": {}, "goals": {}}
    for trained, beaten in DEMOS.items():
        found = demonstrate_one(spec, per_workers, trained)
        if found is None:
            continue
        n, cap, caps, outcomes = found
        expected = {**{mode: OUT_OF_MEMORY for mode in beaten}, trained: TRAINED}
        shown = outcomes == expected
        out["cap"][trained] = {
            "workers": n,
            "cap_mib": cap,
            "tried_mib": caps,
            "outcomes": outcomes,
            "shown": shown,
        }
        key = f"{workload}_{trained}_cap_shown_ratio"
        out[key] = 1.0 if shown else 0.0
        said = ", ".join(f"{mode} {outcomes[mode]}" for mode in (*reversed(beaten), trained))
        out["words"][key] = f"{workload}: {n} workers capped at {cap} MiB each: {said} (1 = shown)"
        out["goals"][key] = ">= 1"
    return out
