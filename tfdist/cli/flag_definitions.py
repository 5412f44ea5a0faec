"""Every flag of the ``tfdist`` command, grouped by the command that reads it.

absl parses all of them before the command is known (an unknown flag is an error
for every command), so they are defined together, here, when the CLI loads.
"""

from __future__ import annotations

from absl import flags

from tfdist.config import (
    COMMUNICATIONS,
    LR_SCALINGS,
    MODEL_OPTION_FIELDS,
    PRECISIONS,
    STRATEGY_NAMES,
    TrainConfig,
)

FLAGS = flags.FLAGS
# absl's own flags (--flagfile, --helpfull, logging's), defined before tfdist's.
_ABSL_FLAGS = frozenset(FLAGS)
ENGINES = ("local", "ray")  # --engine values, checked by `tfdist train`
#: ``--time_to_accuracy_tasks`` (tests/test_cli.py: those of ``bench/time_to_accuracy/tasks.py``).
TIME_TO_ACCURACY_TASKS = ("digits", "patterns")
_DEFAULT = TrainConfig()

# train. Names are plain strings checked by TrainConfig (not DEFINE_enum), so a typo gets the
# same one-line Keras-style error and exit code 2 as every other bad value.
flags.DEFINE_string(
    "strategy", _DEFAULT.strategy, "Distribution strategy: " + ", ".join(STRATEGY_NAMES) + "."
)
flags.DEFINE_integer("num_devices", _DEFAULT.num_devices, "Replicas for --strategy=mirrored.")
flags.DEFINE_string(
    "communication",
    _DEFAULT.communication,
    "Collectives for --strategy=multi_worker: " + ", ".join(COMMUNICATIONS) + ".",
)
flags.DEFINE_integer(
    "num_workers",
    None,
    "Workers of an in-process --strategy=parameter_server cluster; "
    "with --engine=ray, the Ray Train workers (default 2).",
)
flags.DEFINE_string(
    "engine",
    "local",
    "train: where the job runs. local: this process (one task of `tfdist launch`); "
    "ray: a Ray Train group of --num_workers multi_worker tasks on the Ray cluster at RAY_ADDRESS, "
    "else on a new local one on loopback (pip install 'tfdist[ray]').",
)
flags.DEFINE_float(
    "cpus_per_worker", 1, "train --engine=ray: CPUs per Ray worker; TF's thread pools follow them."
)
flags.DEFINE_integer(
    "num_ps", None, "Parameter servers of an in-process --strategy=parameter_server cluster."
)
flags.DEFINE_integer(
    "min_shard_bytes", None, "parameter_server: shard variables larger than this over the ps."
)
flags.DEFINE_string(
    "model",
    _DEFAULT.model,
    "mlp, cnn, convnet, resnet, transformer or gpt (a byte-level language model: its own "
    "defaults for the flags not given, logged; docs/command-line.md).",
)
flags.DEFINE_string(
    "dataset", _DEFAULT.dataset, "digits, patterns, synthetic, python_source or tfds:NAME."
)
flags.DEFINE_string(
    "model_options",
    "",
    "The model's options as key=value pairs: "
    + ", ".join(MODEL_OPTION_FIELDS)
    + ", e.g. width=128,depth=4,heads=4 for gpt (default: the model's own).",
)
flags.DEFINE_integer(
    "seq_len", None, "python_source: bytes per example, the language model's context."
)
flags.DEFINE_integer(
    "max_bytes",
    None,
    "python_source: bytes of the training text (default 2 MiB); the validation text is at most "
    "as long (default 256 KiB).",
)
flags.DEFINE_string("data_dir", None, "tensorflow-datasets data_dir for tfds:NAME.")
flags.DEFINE_integer("epochs", _DEFAULT.epochs, "Epochs to train.")
flags.DEFINE_integer(
    "global_batch_size", _DEFAULT.global_batch_size, "Examples per step over all replicas."
)
flags.DEFINE_integer("steps_per_epoch", None, "Batches per epoch (default: one pass).")
flags.DEFINE_string(
    "precision", _DEFAULT.precision, "Numeric precision: " + ", ".join(PRECISIONS) + "."
)
flags.DEFINE_string(
    "steps_per_execution",
    str(_DEFAULT.steps_per_execution),
    "Batches per tf.function call: a positive integer, or auto (the Trainer's default: 32 "
    "under mirrored and multi_worker, 1 under parameter_server).",
)
flags.DEFINE_integer(
    "accumulation_steps", _DEFAULT.accumulation_steps, "Micro-batches per optimizer update."
)
flags.DEFINE_string("optimizer", _DEFAULT.optimizer, "adam, adamw, sgd or rmsprop.")
flags.DEFINE_float("learning_rate", _DEFAULT.learning_rate, "Base learning rate.")
flags.DEFINE_string(
    "lr_scaling",
    _DEFAULT.lr_scaling,
    f"{', '.join(LR_SCALINGS)}. linear: scale the learning rate by effective batch "
    "/ --base_global_batch_size.",
)
flags.DEFINE_integer(
    "base_global_batch_size",
    _DEFAULT.base_global_batch_size,
    "The batch size --learning_rate is tuned for.",
)
flags.DEFINE_integer("warmup_steps", None, "Linear warmup over this many optimizer updates.")
flags.DEFINE_float("warmup_epochs", None, "Linear warmup over this many epochs.")
flags.DEFINE_string("model_dir", None, "Where the chief saves model.keras after training.")
flags.DEFINE_string(
    "backup_dir",
    None,
    "Step-exact backups here: a restarted run (tfdist launch --max_restarts, "
    "a Slurm requeue) resumes at the last backed-up update; SIGTERM saves one and exits 75.",
)
flags.DEFINE_integer(
    "backup_freq",
    None,
    "With --backup_dir: optimizer updates between backups (default: each epoch).",
)
flags.DEFINE_string(
    "watchdog",
    "",
    "train: the progress watchdog, 'off' or WatchdogOptions fields as key=value pairs, e.g. "
    "floor=60,factor=5 (a hang: stacks dumped, exit 76, the launcher restarts from the backup).",
)
flags.DEFINE_string(
    "stragglers",
    "",
    "train: the straggler report (on by default), 'off', 'on' or StragglerOptions fields as "
    "key=value pairs, e.g. interval=5,log_scores=true,restart_after=3.",
)
flags.DEFINE_integer("seed", _DEFAULT.seed, "Random seed.")
flags.DEFINE_integer("verbose", _DEFAULT.verbose, "0 silent, 1 progress bar, 2 one line per epoch.")
# launch (and manifest)
flags.DEFINE_integer(
    "workers",
    2,
    "launch: worker processes (per node with --hosts); manifest: workers (slurm: per node).",
)
flags.DEFINE_integer(
    "ps",
    0,
    "launch: parameter-server processes (per node with --hosts); "
    "manifest kubernetes: PS replicas; manifest slurm: ps tasks (ranks after the chief).",
)
flags.DEFINE_boolean(
    "chief",
    False,
    "launch: add a chief process (on node 0); manifest kubernetes: a Chief replica; "
    "manifest slurm: rank 0 is the chief.",
)
flags.DEFINE_boolean("evaluator", False, "launch: add an evaluator process (on node 0).")
flags.DEFINE_string(
    "host", "127.0.0.1", "launch: address the processes listen on (loopback by default)."
)
flags.DEFINE_boolean(
    "allow_external", False, "launch: allow non-loopback --host/--hosts (gRPC is unauthenticated)."
)
flags.DEFINE_boolean(
    "private_network",
    True,
    "launch: run a one-machine cluster in a private network namespace "
    "that has only loopback, so no other host reaches its (unauthenticated) gRPC ports; the tasks "
    "reach nothing outside it either. --noprivate_network uses the host's network.",
)
flags.DEFINE_boolean(
    "pin",
    True,
    "launch, manifest slurm: give each chief and worker process of a node its own CPUs and TF "
    "thread pools to match, when they fit on the CPUs the launcher (Slurm: the task) may use "
    "(ps and evaluator: every CPU; under Slurm, the CPUs Slurm bound a task to, if it did); "
    "--pin=false: every process sees every CPU, with TF's default pools.",
)
flags.DEFINE_list(
    "preload",
    [],
    "launch: modules (e.g. tensorflow,keras) that one Python imports before any task starts; "
    "every task, restarts included, is forked from it and starts with them imported. The "
    "command must be PYTHON SCRIPT, PYTHON -m MODULE or PYTHON -c CODE. Default: none, each task "
    "starts afresh. bench: the same for the tasks of the benchmarks that launch processes "
    "(scaling, allreduce, stragglers, health, time_to_accuracy, first_fit).",
)
flags.DEFINE_integer("nnodes", 1, "launch, manifest slurm: the number of nodes (machines).")
flags.DEFINE_integer("node_rank", 0, "launch: this node's index in --hosts; node 0 runs the chief.")
flags.DEFINE_list(
    "hosts",
    None,
    "launch: one host:base_port per node; node k runs its workers, then its ps, "
    "then (node 0) the chief on consecutive ports from its base port (e.g. 2222).",
)
# manifest
flags.DEFINE_string(
    "kind",
    "tfjob",
    "manifest kubernetes: tfjob (Kubeflow) or indexed-job (Job + headless Service).",
)
flags.DEFINE_string("image", None, "manifest kubernetes: the container image.")
flags.DEFINE_string("name", "tfdist", "manifest kubernetes: the resources' name (a DNS label).")
flags.DEFINE_string("job_name", "tfdist", "manifest slurm: #SBATCH --job-name.")
flags.DEFINE_integer(
    "min_nodes",
    None,
    "manifest slurm: start on at least this many nodes, at most --nnodes "
    "(#SBATCH --nodes=MIN-MAX); a backup resumes on whatever count each run gets.",
)
flags.DEFINE_integer(
    "ntasks",
    None,
    "manifest slurm: total tasks (chief + ps + workers), a multiple of --nnodes; "
    "instead of --workers per node.",
)
flags.DEFINE_string("partition", None, "manifest slurm: #SBATCH --partition.")
flags.DEFINE_string("time", None, "manifest slurm: #SBATCH --time, e.g. 01:00:00.")
flags.DEFINE_float("timeout", None, "launch: kill everything after this many seconds.")
flags.DEFINE_integer(
    "max_restarts",
    0,
    "launch, train --engine=ray (Ray's max_failures): restarts after failures "
    "(PS: the failed worker; "
    "otherwise the whole group); manifest slurm: requeues after a preemption (exit 75).",
)
# bench
flags.DEFINE_string(
    "output",
    "bench_results/bench.json",
    "bench: where to write the JSON results; manifest: the file to write (stdout when not given).",
)
# Its names come from the bench's one registry, ``tfdist.bench.names``, which the CLI may read
# only lazily (it imports no bench module when it loads): `tfdist bench --help` lists them
# (`tfdist.cli.bench_command.benchmarks_help`).
flags.DEFINE_list(
    "benchmarks",
    [],
    "bench: which to run, comma-separated: the in-process benchmarks (these by default), or "
    "those that launch worker processes (they take minutes: run only when named); "
    "`tfdist bench --help` names them.",
)
flags.DEFINE_boolean(
    "json",
    False,
    "bench: print the results as JSON on stdout (for scripts) instead of the summary table; "
    "the --output file is written either way.",
)
flags.DEFINE_integer("repeats", 3, "bench: timed repeats per side (the median is reported).")
flags.DEFINE_boolean(
    "quick",
    False,
    "bench: tiny sizes and few steps (checks that it runs; the figures mean little).",
)
flags.DEFINE_integer(
    "threads_per_worker",
    None,
    "bench scaling, allreduce, stragglers, health, time_to_accuracy, memory: intra-op threads "
    "of each worker process (default: cores / most workers).",
)
flags.DEFINE_list(
    "scaling_workers",
    None,
    "bench scaling: worker counts to run, e.g. 1,2 (default 1, 2, 4, ... up to the core count).",
)
flags.DEFINE_integer(
    "per_worker_batch_size",
    None,
    "bench scaling: examples per worker per step (default 256); "
    "bench time_to_accuracy: the same (default: each task's own, 64).",
)
flags.DEFINE_list(
    "hidden_units", None, "bench scaling: the MLP's hidden widths (default 1024,1024,1024)."
)
flags.DEFINE_integer(
    "scaling_steps", None, "bench scaling: steps per timed measurement (default 50)."
)
flags.DEFINE_boolean(
    "scaling_parameter_server",
    None,
    "bench scaling: also the Trainer on parameter_server with 1 ps (default true).",
)
flags.DEFINE_list(
    "gradient_compression",
    None,
    "train: one of none, bf16, fp16: the Trainer all-reduces the gradients in 16 bits "
    "(default none: float32). bench scaling: Trainer (and raw loop) variants, a list of those "
    "(default none); a variant this Trainer lacks is reported as unavailable.",
)
flags.DEFINE_integer(
    "bucket_bytes",
    None,
    "train: the Trainer all-reduces the gradients in buckets of about this many bytes, "
    "overlapping the backward pass (default: one all-reduce). "
    "bench scaling: passed to the Trainer when it takes it.",
)
flags.DEFINE_string(
    "sharding",
    None,
    "train: off, optimizer, gradients or parameters: each replica keeps only its block of the "
    "optimizer state (optimizer, ZeRO-1), of the gradients too (gradients, ZeRO-2), and of the "
    "weights too (parameters, ZeRO-3); mirrored and multi_worker (default off).",
)
flags.DEFINE_string(
    "pipeline",
    "",
    "train: model parallelism, the model cut into pipeline stages in this one process (TF's "
    "default strategy: no --strategy) or, with --strategy=multi_worker, in each worker; off or "
    "key=value pairs: split_at=NAME or NAME+NAME+... (stage k ends with layer NAME k) or auto "
    "with stages=K, micro_batches=M, devices=D0+D1+... (default: GPUs, else one logical CPU "
    "device per stage), allow_batch_norm=true, schedule=gpipe|1f1b; e.g. "
    "split_at=conv_1,micro_batches=4 (default off).",
)
flags.DEFINE_float(
    "target_accuracy",
    None,
    "bench time_to_accuracy: the validation accuracy each side trains to (default: each "
    "task's own, digits 0.97, patterns 0.99).",
)
flags.DEFINE_list(
    "time_to_accuracy_tasks",
    None,
    "bench time_to_accuracy: the tasks to train, comma-separated: digits (the digits CNN, too "
    "small for a second worker to pay), patterns (a compute-bound convnet on generated 32x32x3 "
    "images) (default: both).",
)
flags.DEFINE_integer("allreduce_workers", None, "bench allreduce: worker processes (default 2).")
flags.DEFINE_integer(
    "allreduce_max_bytes", None, "bench allreduce: largest message (default 64 MiB)."
)
flags.DEFINE_float(
    "slow_fsync_ms",
    None,
    "bench backup: a simulated slow disk: each fsync of a backup's commit first sleeps this many "
    "milliseconds (default 0).",
)
flags.DEFINE_integer(
    "first_fit_launches",
    None,
    "bench first_fit: launches of 2 workers, each giving one first fit on a fresh cluster "
    "(default 3).",
)
flags.DEFINE_float(
    "straggler_factor",
    None,
    "bench stragglers: worker 1 sleeps before each batch so that its step takes about this many "
    "times as long (default 2).",
)
flags.DEFINE_list(
    "balance_sides",
    None,
    "bench balance: the sides to launch, from even, balanced, parameter_server, even_pair, "
    "balanced_pair, even_latency, balanced_latency, pair_ab, loaded_ab (default all but "
    "parameter_server; even and balanced, or an A/B side, required).",
)
flags.DEFINE_list(
    "memory_workloads",
    None,
    "bench memory: the workloads to measure, from mlp, gpt (default both).",
)
flags.DEFINE_string(
    "balance",
    "",
    "train: multi_worker only: each worker's share of every global batch follows its measured "
    "speed (the global batch and the update stay the same); off (default), on, or "
    "BalanceOptions fields as key=value pairs, e.g. window=64,floor=0.2.",
)
flags.DEFINE_string(
    "local_sgd",
    "",
    "train: mirrored and multi_worker: each replica takes its own updates, with no gradient "
    "all-reduce, and the replicas average their parameters every H updates (local SGD), or, "
    "with outer=nesterov or outer=sgd, apply the averaged change with an outer SGD (DiLoCo); "
    "off (default) or key=value pairs: sync_every=H (required), outer=none|sgd|nesterov, "
    "outer_learning_rate (default 0.7), outer_momentum (default 0.9 for nesterov, else 0), "
    "fragments=K (streaming DiLoCo: K pieces of the model synced in turn, one every H/K "
    "updates; default 1); e.g. sync_every=16,outer=nesterov.",
)
#: Every flag tfdist defines (absl's own, such as --flagfile, are left out).
TFDIST_FLAGS = frozenset(FLAGS) - _ABSL_FLAGS
_LAUNCH_LAYOUT = frozenset({"workers", "ps", "chief", "max_restarts", "nnodes"})
#: The flags each command reads. A tfdist flag given to a command that does not read it is
#: refused, not ignored (tests/test_house.py checks these sets against the commands' code).
READS = {
    "train": frozenset(
        ("strategy", "num_devices", "communication", "num_workers", "num_ps", "min_shard_bytes")
        + ("model", "dataset", "data_dir", "epochs", "global_batch_size", "steps_per_epoch")
        + ("precision", "steps_per_execution", "accumulation_steps", "optimizer", "learning_rate")
        + ("lr_scaling", "base_global_batch_size", "warmup_steps", "warmup_epochs", "model_dir")
        + ("backup_dir", "backup_freq", "seed", "verbose", "watchdog", "stragglers")
        + ("gradient_compression", "bucket_bytes", "sharding", "pipeline", "engine")
        + ("cpus_per_worker", "max_restarts", "balance", "model_options", "seq_len", "max_bytes")
        + ("local_sgd",)
    ),
    "launch": _LAUNCH_LAYOUT
    | {"evaluator", "host", "hosts", "node_rank", "allow_external", "private_network", "pin"}
    | {"timeout", "preload"},
    "manifest": _LAUNCH_LAYOUT
    | {"ntasks", "min_nodes", "partition", "time", "job_name", "image", "name", "kind", "output"}
    | {"evaluator", "hosts", "node_rank", "pin"},  # refused per kind (manifest_command)
    "bench": frozenset(
        {
            "benchmarks",
            "json",
            "repeats",
            "quick",
            "output",
            "threads_per_worker",
            "scaling_steps",
            "per_worker_batch_size",
            "scaling_parameter_server",
            "gradient_compression",
            "bucket_bytes",
            "allreduce_max_bytes",
            "allreduce_workers",
            "slow_fsync_ms",
            "straggler_factor",
            "balance_sides",
            "memory_workloads",
            "target_accuracy",
            "time_to_accuracy_tasks",
            "scaling_workers",
            "hidden_units",
            "first_fit_launches",
            "preload",
        }
    ),
}
#: Flags ``tfdist train`` reads only with ``--engine=ray``.
RAY_ONLY_TRAIN_FLAGS = ("cpus_per_worker", "max_restarts")
