"""The benchmark tasks of ``tfdist bench --benchmarks=time_to_accuracy``: what each trains.

``--time_to_accuracy_tasks=digits,patterns`` (both by default) chooses them. Each names a
dataset and a model (``tfdist.data.load`` and ``tfdist.models.get`` with the options here)
and its own per-worker batch, target accuracy and epochs; ``--per_worker_batch_size`` and
``--target_accuracy`` set every chosen task's, when given.

* ``digits``: the digits CNN on scikit-learn's 8x8 digits, ``tfdist train``'s defaults. Its
  epoch is about a second: too small for the exchange to pay, the honest counter-example.
* ``patterns``: the ``convnet`` (66k parameters, about 0.15 GFLOP per 32x32x3 example
  forward and backward) on generated images (noise, and the class's motif at a random
  place). At 64 examples per worker an update is 75-80 ms of compute on one core (an Intel
  Xeon with AMX) against a 265 KB all-reduce of about 10 ms over loopback: compute-bound. At
  16 the exchange was as long as the compute on that machine, and two workers trained only
  1.2x as fast as one. With linear LR scaling, doubling the batch (2 workers) costs no extra
  epochs to the target, on this seed (3 on both; 4 against 3 without scaling).
"""

from __future__ import annotations

from typing import Any

from tfdist.config import invalid_argument

#: The benchmark tasks by name: what each trains (``tfdist.data.load`` and
#: ``tfdist.models.get`` with these options) and its own batch, target and epochs.
TASKS: dict[str, dict[str, Any]] = {
    "digits": {
        "dataset": "digits",
        "train_data": {},
        "validation_data": {},
        "model": "cnn",
        "model_options": {},
        # tfdist train's default global batch, on one worker.
        "per_worker_batch_size": 64,
        "target_accuracy": 0.97,
        "max_epochs": 40,
    },
    "patterns": {
        "dataset": "patterns",
        "train_data": {"num_examples": 4096},
        "validation_data": {"num_examples": 1024},
        "model": "convnet",
        "model_options": {},
        "per_worker_batch_size": 64,
        "target_accuracy": 0.99,
        "max_epochs": 10,
    },
}
#: The goal of each task's 2-worker / 1-worker ratios (None: no goal, a counter-example).
GOALS = {"digits": None, "patterns": "<= 0.6"}
QUICK_TASKS: dict[str, dict[str, Any]] = {
    "digits": {"per_worker_batch_size": 32, "target_accuracy": 0.6, "max_epochs": 2},
    "patterns": {
        "train_data": {"num_examples": 128, "input_shape": (8, 8, 3)},
        "validation_data": {"num_examples": 64, "input_shape": (8, 8, 3)},
        "model_options": {"filters": (4, 8)},
        "per_worker_batch_size": 32,
        "target_accuracy": 0.6,
        "max_epochs": 2,
    },
}
#: The options of `run` that set every task's own value when given.
TASK_OPTIONS = ("per_worker_batch_size", "target_accuracy", "max_epochs")


def check_tasks(tasks: Any) -> tuple[str, ...]:
    """``tasks`` (names, or one comma-separated string) as a tuple of task names, each once.

    Raises:
        ValueError: Unless there is at least one name and every one names a task (Keras-style,
            naming ``time_to_accuracy_tasks``, as ``tfdist bench`` checks the flag before
            TensorFlow loads).
    """
    names = tasks.split(",") if isinstance(tasks, str) else tasks
    listed = isinstance(names, (list, tuple))
    unknown = [n for n in names if n not in TASKS] if listed else []
    if not listed or not names or unknown:
        raise invalid_argument(
            "time_to_accuracy_tasks",
            ",".join(map(str, names)) if listed else tasks,
            f"one or more of: {', '.join(TASKS)}, comma-separated",
            note=f"Unknown: {', '.join(map(repr, unknown))}." if unknown else "",
        )
    return tuple(dict.fromkeys(names))


def task_specs(options: dict[str, Any], quick: bool) -> list[dict[str, Any]]:
    """Each chosen task's settings: its own (`TASKS`), ``--quick``'s, then the options given."""
    specs = []
    for name in options["tasks"]:
        task = {"name": name, **TASKS[name], **(QUICK_TASKS[name] if quick else {})}
        task.update({k: options[k] for k in TASK_OPTIONS if options[k] is not None})
        task["target_accuracy"] = float(task["target_accuracy"])
        specs.append(task)
    return specs
