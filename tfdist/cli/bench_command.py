"""``tfdist bench``: the benchmarks of `tfdist.bench`, written as JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence

from tfdist.cli.flag_definitions import FLAGS, TIME_TO_ACCURACY_TASKS
from tfdist.config import invalid_argument


def benchmarks_help() -> str:
    """``--benchmarks``' help in ``tfdist bench --help``: every name, from the bench's registry.

    ``tfdist.bench.names`` is pure Python: reading it loads no TensorFlow.
    """
    from tfdist.bench.names import IN_PROCESS, LAUNCHING

    return (
        "Which to run, comma-separated: "
        + ", ".join(IN_PROCESS)
        + " (these by default), or "
        + ", ".join(LAUNCHING)
        + " (they launch worker processes and take minutes: run only when named)."
    )


def _check_benchmarks(names: Sequence[str]) -> None:
    """Refuses an unknown ``--benchmarks`` name before TensorFlow is imported."""
    from tfdist.bench.names import all_names

    valid = list(all_names())
    for name in names:
        if name not in valid:
            raise invalid_argument("benchmarks", name, valid)


def _check_tasks(names: Sequence[str]) -> tuple[str, ...]:
    """``--time_to_accuracy_tasks``, each name once, checked before TensorFlow is imported.

    The same refusal as ``tfdist.bench.time_to_accuracy.tasks.check_tasks``.
    """
    unknown = [n for n in names if n not in TIME_TO_ACCURACY_TASKS]
    if not names or unknown:
        raise invalid_argument(
            "time_to_accuracy_tasks",
            ",".join(names),
            f"one or more of: {', '.join(TIME_TO_ACCURACY_TASKS)}, comma-separated",
            note=f"Unknown: {', '.join(map(repr, unknown))}." if unknown else "",
        )
    return tuple(dict.fromkeys(names))


def run(args: Sequence[str]) -> int:
    """Runs the benchmarks the flags choose; prints a summary table (``--json``: the JSON).

    Returns:
        The exit code, 0.
    """
    _check_benchmarks(FLAGS.benchmarks)
    tasks = FLAGS.time_to_accuracy_tasks
    tasks = None if tasks is None else _check_tasks(tasks)
    from tfdist.bench import runner

    def ints(name: str) -> tuple[int, ...] | None:
        values = FLAGS[name].value
        if values is None:
            return None
        try:
            return tuple(int(v) for v in values)
        except ValueError:
            raise invalid_argument(
                name, ",".join(values), "comma-separated integers, e.g. 1,2"
            ) from None

    options = {
        "threads_per_worker": FLAGS.threads_per_worker,
        "scaling_workers": ints("scaling_workers"),
        "per_worker_batch_size": FLAGS.per_worker_batch_size,
        "hidden_units": ints("hidden_units"),
        "scaling_steps": FLAGS.scaling_steps,
        "scaling_parameter_server": FLAGS.scaling_parameter_server,
        "gradient_compression": None
        if FLAGS.gradient_compression is None
        else tuple(FLAGS.gradient_compression),
        "bucket_bytes": FLAGS.bucket_bytes,
        "allreduce_workers": FLAGS.allreduce_workers,
        "allreduce_max_bytes": FLAGS.allreduce_max_bytes,
        "straggler_factor": FLAGS.straggler_factor,
        "balance_sides": None if FLAGS.balance_sides is None else tuple(FLAGS.balance_sides),
        "memory_workloads": None
        if FLAGS.memory_workloads is None
        else tuple(FLAGS.memory_workloads),
        "target_accuracy": FLAGS.target_accuracy,
        "time_to_accuracy_tasks": tasks,
        "slow_fsync_ms": FLAGS.slow_fsync_ms,
        "first_fit_launches": FLAGS.first_fit_launches,
        "preload": tuple(FLAGS.preload) or None,
    }
    results = runner.run(
        FLAGS.benchmarks or None,
        output=FLAGS.output,
        repeats=FLAGS.repeats,
        quick=FLAGS.quick,
        options=options,
    )
    if FLAGS.json:
        print(json.dumps(results, indent=2))
    else:
        from tfdist.bench.harness import report

        print(report.summary(results, results["meta"].get("files", ())), end="")
    return 0
