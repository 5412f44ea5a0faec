"""``tfdist --help``, ``tfdist COMMAND --help`` and ``tfdist --version``: help as people expect it.

The flags stay absl's; the help is this module's. ``tfdist``, ``tfdist -h``, ``tfdist --help``
and ``tfdist help`` list the commands; ``tfdist COMMAND -h`` (or ``--help``, or ``tfdist help
COMMAND``) prints that command's usage, examples and its own flags only, in groups, with their
defaults. Each exits 0. absl's ``--helpfull`` (every flag, absl's own included) is left as it is.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from importlib import metadata

from tfdist.cli import bench_command
from tfdist.cli.flag_definitions import FLAGS, READS

SUMMARIES = {
    "train": "train a Keras model on the embedded digits data (or a named model and dataset)",
    "launch": "start a cluster of local processes (TF_CONFIG each) running one command",
    "manifest": "write a Slurm batch script or a Kubernetes manifest for a tfdist job",
    "bench": "measure tfdist side by side with plain Keras and raw TF: a table, JSON, charts",
}

USAGES = {
    "train": "tfdist train [flags]",
    "launch": "tfdist launch [flags] -- COMMAND [ARGS...]",
    "manifest": "tfdist manifest {slurm,kubernetes} [flags] -- COMMAND [ARGS...]",
    "bench": "tfdist bench [flags]",
}

EXAMPLES = {
    "train": (
        "tfdist train                                   # mirrored over 2 CPU devices, digits",
        "tfdist train --strategy=one_device --epochs=3",
        "tfdist launch --workers=2 -- tfdist train --strategy=multi_worker",
        "tfdist train --engine=ray --num_workers=2 --epochs=5",
        "tfdist train --pipeline=split_at=conv_1,micro_batches=4   # 2 stages, 1 process",
        "tfdist train --model=gpt                       # a byte-level GPT on Python's source",
    ),
    "launch": (
        "tfdist launch --workers=2 -- tfdist train --strategy=multi_worker",
        "tfdist launch --workers=2 --ps=1 -- tfdist train --strategy=parameter_server "
        "--steps_per_epoch=20",
        "tfdist launch --nnodes=2 --node_rank=0 --hosts=h1:2222,h2:2222 --allow_external "
        "-- tfdist train --strategy=multi_worker",
    ),
    "manifest": (
        "tfdist manifest slurm --nnodes=2 --workers=4 --output=job.sbatch -- tfdist train "
        "--strategy=multi_worker",
        "tfdist manifest kubernetes --workers=2 --image=IMAGE --output=job.yaml -- tfdist train "
        "--strategy=multi_worker",
    ),
    "bench": (
        "tfdist bench                                   # the in-process benchmarks",
        "tfdist bench --benchmarks=scaling --threads_per_worker=1 --repeats=5",
        "tfdist bench --quick --output=/tmp/bench.json",
    ),
}

#: Each command's flags in the groups its help shows, in order. Together they are exactly the
#: flags the command reads (`READS`; tests/test_cli.py).
GROUPS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "train": (
        (
            "Strategy",
            ("strategy", "num_devices", "communication", "num_workers", "num_ps")
            + ("min_shard_bytes",),
        ),
        (
            "Model and data",
            ("model", "dataset", "data_dir", "epochs", "global_batch_size", "steps_per_epoch")
            + ("seed", "verbose", "model_options", "seq_len", "max_bytes"),
        ),
        (
            "Optimizer",
            ("optimizer", "learning_rate", "lr_scaling", "base_global_batch_size")
            + ("warmup_steps", "warmup_epochs", "accumulation_steps"),
        ),
        ("Speed", ("precision", "steps_per_execution", "gradient_compression", "bucket_bytes")),
        ("Load balancing", ("balance",)),
        ("Slow links", ("local_sgd",)),
        ("Memory", ("sharding",)),
        ("Model parallelism", ("pipeline",)),
        (
            "Saving and fault tolerance",
            ("model_dir", "backup_dir", "backup_freq", "watchdog", "stragglers"),
        ),
        ("Engine", ("engine", "cpus_per_worker", "max_restarts")),
    ),
    "launch": (
        ("Processes", ("workers", "ps", "chief", "evaluator", "pin", "preload")),
        ("Network", ("host", "hosts", "nnodes", "node_rank", "allow_external", "private_network")),
        ("Restarts and time", ("max_restarts", "timeout")),
    ),
    "manifest": (
        ("Layout", ("workers", "ps", "chief", "nnodes", "ntasks", "min_nodes", "pin")),
        ("Slurm", ("job_name", "partition", "time", "max_restarts")),
        ("Kubernetes", ("kind", "image", "name")),
        ("Output", ("output",)),
    ),
    "bench": (
        ("Which and how", ("benchmarks", "repeats", "quick", "output", "json", "preload")),
        (
            "scaling",
            ("threads_per_worker", "scaling_workers", "per_worker_batch_size", "hidden_units")
            + ("scaling_steps", "scaling_parameter_server", "gradient_compression")
            + ("bucket_bytes",),
        ),
        (
            "The other benchmarks",
            ("allreduce_workers", "allreduce_max_bytes", "slow_fsync_ms", "straggler_factor")
            + ("target_accuracy", "time_to_accuracy_tasks", "first_fit_launches")
            + ("balance_sides", "memory_workloads"),
        ),
    ),
}

#: The help of a flag that several commands read, as each reads it (the flag's own help
#: speaks of every command). A flag of one command shows its own help.
OWN_TEXT = {
    ("train", "gradient_compression"): "none, bf16 or fp16: all-reduce the gradients in 16 bits.",
    ("train", "bucket_bytes"): "All-reduce the gradients in buckets of about this many bytes, "
    "overlapping the backward pass (default: one all-reduce).",
    ("train", "max_restarts"): "With --engine=ray: restarts after failures (Ray's max_failures).",
    ("bench", "gradient_compression"): "scaling: the Trainer (and raw loop) variants to compare, "
    "a list of none, bf16, fp16 (default none).",
    ("bench", "bucket_bytes"): "scaling: passed to the Trainer.",
    ("bench", "output"): "Where to write the JSON results.",
    ("bench", "preload"): "Modules (e.g. tensorflow,keras) that one Python imports before the "
    "tasks of the benchmarks that launch processes start; each task is forked from it.",
    ("launch", "workers"): "Worker processes (per node with --hosts).",
    ("launch", "ps"): "Parameter-server processes (per node with --hosts).",
    ("launch", "chief"): "Add a chief process (on node 0).",
    ("launch", "nnodes"): "The number of nodes (machines).",
    ("launch", "max_restarts"): "Restarts after failures (PS: the failed worker; otherwise the "
    "whole group).",
    ("launch", "pin"): "Give each chief and worker process its own CPUs and TF thread pools to "
    "match, when they fit on the CPUs this process may use (ps and evaluator: every CPU); "
    "--pin=false: every process sees every CPU, with TF's default pools.",
    ("launch", "preload"): "Modules (e.g. tensorflow,keras) that one Python imports before any "
    "task starts; every task, restarts included, is forked from it. The command must be PYTHON "
    "SCRIPT, PYTHON -m MODULE or PYTHON -c CODE. Default: none, each task starts afresh.",
    ("manifest", "workers"): "Workers (slurm: per node).",
    ("manifest", "ps"): "kubernetes: PS replicas; slurm: ps tasks (ranks after the chief).",
    ("manifest", "chief"): "kubernetes: a Chief replica; slurm: rank 0 is the chief.",
    ("manifest", "nnodes"): "slurm: the number of nodes (machines).",
    ("manifest", "max_restarts"): "slurm: requeues after a preemption (exit 75).",
    ("manifest", "pin"): "slurm: give each chief and worker task its own CPUs and TF thread "
    "pools (the CPUs Slurm bound it to, if it did).",
    ("manifest", "output"): "The file to write (stdout when not given).",
}

#: Defaults that the command does not use as such (manifest writes to stdout without --output).
NO_DEFAULT = {("manifest", "output")}

_WIDTH = 100
_FLAG_COLUMN = 30


def top_help() -> str:
    """What ``tfdist``, ``tfdist -h`` and ``tfdist --help`` print: the commands."""
    lines = [
        "usage: tfdist COMMAND [flags] [-- ARGS...]",
        "",
        "One Keras 3 training loop for TensorFlow's Mirrored, MultiWorkerMirrored and",
        "ParameterServer strategies.",
        "",
        "Commands:",
    ]
    lines += [f"  {name:<10}{summary}" for name, summary in SUMMARIES.items()]
    lines += [
        "",
        "Run `tfdist COMMAND --help` for a command's flags, `tfdist --version` for the version.",
        "Example: tfdist launch --workers=2 -- tfdist train --strategy=multi_worker",
    ]
    return "\n".join(lines) + "\n"


def _default(command: str, name: str, text: str) -> str:
    """`` (default: VALUE)``, unless the text already says its default or there is none."""
    value = FLAGS[name].default
    if "default" in text or (command, name) in NO_DEFAULT or value in (None, [], ""):
        return ""
    if isinstance(value, bool):
        return f" (default: {'true' if value else 'false'})"
    if isinstance(value, list):
        value = ",".join(str(v) for v in value)
    return f" (default: {value})"


def _flag_text(command: str, name: str) -> str:
    """The flag's help as ``command`` reads it: without a leading ``COMMAND:`` of its own."""
    text = OWN_TEXT.get((command, name), FLAGS[name].help)
    if (command, name) == ("bench", "benchmarks"):
        text = bench_command.benchmarks_help()  # the names, read from the bench's registry
    if text.startswith(f"{command}: "):
        text = text[len(command) + 2 :]
        if not text.split(" ", 1)[0].endswith((":", ",")):
            text = text[:1].upper() + text[1:]
    elif text.startswith(f"{command} "):
        text = text[len(command) + 1 :]
    return text


def _flag_lines(command: str, name: str) -> list[str]:
    kind = type(FLAGS[name].parser).__name__
    metavar = {"BooleanParser": "", "IntegerParser": "=INT", "FloatParser": "=NUM"}
    head = f"  --{name}{metavar.get(kind, '=A,B' if kind == 'ListParser' else '=STR')}"
    text = _flag_text(command, name)
    body = textwrap.wrap(
        text + _default(command, name, text), _WIDTH - _FLAG_COLUMN, break_on_hyphens=False
    )
    if len(head) + 2 > _FLAG_COLUMN:
        return [head] + [" " * _FLAG_COLUMN + line for line in body]
    first = head.ljust(_FLAG_COLUMN) + body[0]
    return [first] + [" " * _FLAG_COLUMN + line for line in body[1:]]


def command_help(command: str) -> str:
    """What ``tfdist COMMAND --help`` prints: usage, examples, and the command's own flags."""
    summary = SUMMARIES[command]
    lines = [f"usage: {USAGES[command]}", "", summary[:1].upper() + summary[1:] + ".", ""]
    lines += ["Examples:"] + [f"  {example}" for example in EXAMPLES[command]]
    for title, names in GROUPS[command]:
        lines += ["", f"{title}:"]
        for name in names:
            lines += _flag_lines(command, name)
    if command == "train":
        lines += ["", "--cpus_per_worker and --max_restarts are read only with --engine=ray."]
    lines += ["", "Boolean flags also take --noNAME; every flag also takes --NAME VALUE."]
    return "\n".join(lines) + "\n"


def requested(argv: Sequence[str]) -> str | None:
    """The help or version text ``argv`` asks for, or None when it asks for neither.

    Only the words before ``--`` count: ``tfdist launch -- tool --help`` is the tool's.
    """
    words = list(argv[1:])
    if "--" in words:
        words = words[: words.index("--")]
    if "--version" in words:
        return f"tfdist {metadata.version('tfdist')}\n"  # the installed package's
    asks = any(w in ("-h", "--help") for w in words)
    positional = [w for w in words if not w.startswith("-")]
    if positional[:1] == ["help"]:
        return (
            command_help(positional[1])
            if positional[1:2] and positional[1] in READS
            else top_help()
        )
    if not positional:
        return top_help() if asks or not words else None
    if asks and positional[0] in READS:
        return command_help(positional[0])
    return top_help() if asks else None
