"""The ``tfdist`` command line (also ``python -m tfdist``).

tfdist train --strategy=mirrored --num_devices=2 --model=cnn --dataset=digits --epochs=8
tfdist launch --workers=2 -- tfdist train --strategy=multi_worker
tfdist train --engine=ray --num_workers=2 --epochs=5      # a Ray Train group (RAY_ADDRESS, else a local cluster)
tfdist launch --nnodes=2 --node_rank=0 --hosts=h1:2222,h2:2222 --allow_external -- tfdist train ...
tfdist manifest slurm --nnodes=2 --workers=4 --output=job.sbatch -- tfdist train --strategy=multi_worker
tfdist manifest slurm --ntasks=2 --max_restarts=3 -- tfdist train --strategy=multi_worker --backup_dir=DIR
tfdist manifest kubernetes --workers=2 --image=IMAGE --output=job.yaml -- tfdist train --strategy=multi_worker
tfdist bench --output=bench_results/bench.json
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
import sys
from collections.abc import Sequence

from absl import app, flags

from tfdist.config import (
    COMMUNICATIONS,
    LR_SCALINGS,
    PRECISIONS,
    STRATEGY_NAMES,
    TrainConfig,
    invalid_argument,
)

FLAGS = flags.FLAGS
COMMANDS = ("train", "launch", "bench", "manifest")
# TF's C++ log level when the user has not chosen one: 3 hides its INFO, WARNING and ERROR lines. On a first
# run those are all noise ("failed call to cuInit" without a GPU, "Local rendezvous is aborting with status:
# CANCELLED" at the end of an epoch, "GeneratorDatasetOp ... will not be optimized"); real failures still
# reach Python as exceptions. TF_CPP_MIN_LOG_LEVEL=0 shows everything.
QUIET_TF_CPP_MIN_LOG_LEVEL = "3"
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
ENGINES = ("local", "ray")
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
flags.DEFINE_string("model", _DEFAULT.model, "mlp, cnn, resnet or transformer.")
flags.DEFINE_string("dataset", _DEFAULT.dataset, "digits, synthetic or tfds:NAME.")
flags.DEFINE_string("data_dir", None, "tensorflow-datasets data_dir for tfds:NAME.")
flags.DEFINE_integer("epochs", _DEFAULT.epochs, "Epochs to train.")
flags.DEFINE_integer(
    "global_batch_size", _DEFAULT.global_batch_size, "Examples per step over all replicas."
)
flags.DEFINE_integer("steps_per_epoch", None, "Batches per epoch (default: one pass).")
flags.DEFINE_string(
    "precision", _DEFAULT.precision, "Numeric precision: " + ", ".join(PRECISIONS) + "."
)
flags.DEFINE_integer(
    "steps_per_execution", _DEFAULT.steps_per_execution, "Batches per tf.function call."
)
flags.DEFINE_integer(
    "accumulation_steps", _DEFAULT.accumulation_steps, "Micro-batches per optimizer update."
)
flags.DEFINE_string("optimizer", _DEFAULT.optimizer, "adam, adamw, sgd or rmsprop.")
flags.DEFINE_float("learning_rate", _DEFAULT.learning_rate, "Base learning rate.")
flags.DEFINE_string(
    "lr_scaling",
    _DEFAULT.lr_scaling,
    f"{', '.join(LR_SCALINGS)}. linear: scale the learning rate by effective batch / --base_global_batch_size.",
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
flags.DEFINE_list("benchmarks", [], "bench: which to run (default all).")
flags.DEFINE_integer("repeats", 3, "bench: timed repeats per side (the median is reported).")
flags.DEFINE_boolean(
    "quick",
    False,
    "bench: tiny sizes and few steps (checks that it runs; the figures mean little).",
)
flags.DEFINE_integer(
    "threads_per_worker",
    None,
    "bench scaling, allreduce: intra-op threads of each worker "
    "process (default: cores / most workers).",
)
flags.DEFINE_list(
    "scaling_workers",
    None,
    "bench scaling: worker counts to run, e.g. 1,2 (default 1, 2, 4, ... up to the core count).",
)
flags.DEFINE_integer(
    "per_worker_batch_size", None, "bench scaling: examples per worker per step (default 256)."
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
    "bench scaling: Trainer (and raw loop) variants, of none, bf16, "
    "fp16 (default none); a variant this Trainer lacks is reported as unavailable.",
)
flags.DEFINE_integer("bucket_bytes", None, "bench scaling: passed to the Trainer when it takes it.")
flags.DEFINE_integer("allreduce_workers", None, "bench allreduce: worker processes (default 2).")
flags.DEFINE_integer(
    "allreduce_max_bytes", None, "bench allreduce: largest message (default 64 MiB)."
)


def _train_config() -> TrainConfig:
    return TrainConfig(
        strategy=FLAGS.strategy,
        num_devices=FLAGS.num_devices,
        communication=FLAGS.communication,
        num_workers=FLAGS.num_workers,
        num_ps=FLAGS.num_ps,
        min_shard_bytes=FLAGS.min_shard_bytes,
        model=FLAGS.model,
        dataset=FLAGS.dataset,
        data_dir=FLAGS.data_dir,
        epochs=FLAGS.epochs,
        global_batch_size=FLAGS.global_batch_size,
        steps_per_epoch=FLAGS.steps_per_epoch,
        precision=FLAGS.precision,
        steps_per_execution=FLAGS.steps_per_execution,
        accumulation_steps=FLAGS.accumulation_steps,
        optimizer=FLAGS.optimizer,
        learning_rate=FLAGS.learning_rate,
        lr_scaling=FLAGS.lr_scaling,
        base_global_batch_size=FLAGS.base_global_batch_size,
        warmup_steps=FLAGS.warmup_steps,
        warmup_epochs=FLAGS.warmup_epochs,
        model_dir=FLAGS.model_dir,
        backup_dir=FLAGS.backup_dir,
        backup_freq=FLAGS.backup_freq,
        seed=FLAGS.seed,
        verbose=FLAGS.verbose,
    )


def _train(args: Sequence[str]) -> int:
    if args:
        raise invalid_argument(
            "args",
            list(args),
            "no positional arguments for `tfdist train`",
            note="Options are flags, e.g. --epochs=5.",
        )
    if FLAGS.engine not in ENGINES:
        raise invalid_argument("engine", FLAGS.engine, ENGINES)
    from tfdist.launch import train

    if FLAGS.engine == "ray":
        if FLAGS.strategy != "multi_worker" and FLAGS["strategy"].present:
            raise invalid_argument(
                "strategy",
                FLAGS.strategy,
                "multi_worker with --engine=ray",
                note="Ray Train runs all-worker groups (MultiWorkerMirroredStrategy).",
            )
        from tfdist.launch.ray_engine import ray_launcher

        num_workers = FLAGS.num_workers or 2
        FLAGS.strategy, FLAGS.num_workers = (
            "multi_worker",
            None,
        )  # each Ray worker is one multi_worker task
        summary = ray_launcher(
            train.run,
            _train_config(),
            num_workers=num_workers,
            cpus_per_worker=FLAGS.cpus_per_worker,
            max_failures=FLAGS.max_restarts,
        )
    else:
        summary = train.run(_train_config())
    if summary["is_chief"]:
        print(
            f"final val_accuracy={summary['val_accuracy']:.4f} val_loss={summary['val_loss']:.4f} "
            f"replicas={summary['num_replicas']} train_seconds={summary['seconds']:.1f}"
        )
    # Every task reports its update count and weights, so a job's logs show that the workers agree.
    print(
        f"final updates={summary['updates']} weights_digest={summary['weights_digest']}", flush=True
    )
    return 0


def _launch(args: Sequence[str]) -> int:
    if not args:
        raise invalid_argument(
            "command",
            [],
            "a command after --",
            note="tfdist launch needs a command after --, e.g. tfdist launch --workers=2 -- tfdist train.",
        )
    from tfdist.launch.local import launch

    return launch(
        list(args),
        workers=FLAGS.workers,
        ps=FLAGS.ps,
        chief=FLAGS.chief,
        evaluator=FLAGS.evaluator,
        host=FLAGS.host,
        allow_external=FLAGS.allow_external,
        timeout=FLAGS.timeout,
        max_restarts=FLAGS.max_restarts,
        nnodes=FLAGS.nnodes,
        node_rank=FLAGS.node_rank,
        hosts=FLAGS.hosts,
        private_network=FLAGS.private_network,
    )


# Flags a manifest kind does not use, refused when given rather than silently ignored.
_MANIFEST_UNUSED = {
    "slurm": ("evaluator", "image", "kind", "name", "hosts", "node_rank"),
    "kubernetes": (
        "nnodes",
        "evaluator",
        "partition",
        "time",
        "job_name",
        "hosts",
        "node_rank",
        "ntasks",
        "max_restarts",
    ),
}


def _manifest(args: Sequence[str]) -> int:
    from tfdist.launch import manifests

    kind = args[0] if args else None
    if kind not in manifests.MANIFEST_KINDS:
        raise invalid_argument(
            "manifest",
            kind,
            manifests.MANIFEST_KINDS,
            note="Write it right after `manifest`, e.g. tfdist manifest slurm --nnodes=2 -- CMD.",
        )
    command = list(args[1:])
    if not command:
        raise invalid_argument(
            "command",
            [],
            "a command after --",
            note=f"tfdist manifest {kind} needs a command after --, e.g. tfdist manifest {kind} "
            "--workers=2 -- tfdist train --strategy=multi_worker.",
        )
    for name in _MANIFEST_UNUSED[kind]:
        if FLAGS[name].present:
            raise invalid_argument(
                name, FLAGS[name].value, f"no --{name} for `tfdist manifest {kind}`"
            )
    if kind == "slurm":
        text = manifests.slurm_script(
            command,
            nnodes=FLAGS.nnodes,
            workers=FLAGS.workers if FLAGS["workers"].present else None,
            ntasks=FLAGS.ntasks,
            ps=FLAGS.ps,
            chief=FLAGS.chief,
            partition=FLAGS.partition,
            time=FLAGS.time,
            job_name=FLAGS.job_name,
            max_restarts=FLAGS.max_restarts,
        )
        submit = "sbatch"
    else:
        text = manifests.kubernetes_manifest(
            command,
            workers=FLAGS.workers,
            image=FLAGS.image,
            ps=FLAGS.ps,
            chief=FLAGS.chief,
            name=FLAGS.name,
            kind=FLAGS.kind,
        )
        submit = "kubectl apply -f"
    if not FLAGS["output"].present:
        sys.stdout.write(text)
        return 0
    with open(FLAGS.output, "w") as f:
        f.write(text)
    print(f"Wrote {FLAGS.output}; submit it with: {submit} {FLAGS.output}")
    return 0


def _bench(args: Sequence[str]) -> int:
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
    }
    results = runner.run(
        FLAGS.benchmarks or None,
        output=FLAGS.output,
        repeats=FLAGS.repeats,
        quick=FLAGS.quick,
        options=options,
    )
    print(json.dumps(results, indent=2))
    return 0


def _flag_error(error: flags.Error) -> str:
    """Words an absl parsing error like every other bad argument."""
    if isinstance(error, flags.UnrecognizedFlagError):
        close = difflib.get_close_matches(error.flagname, list(FLAGS), n=1)
        return str(
            invalid_argument(
                "flag",
                error.flagvalue,
                "a flag tfdist defines (see --helpfull)",
                note=f"Did you mean --{close[0]}?" if close else "",
            )
        )
    match = re.fullmatch(r"flag --([\w-]+)=(.*?): .*", str(error), flags=re.DOTALL)
    if isinstance(error, flags.IllegalFlagValueError) and match and match.group(1) in FLAGS:
        kind = FLAGS[match.group(1)].flag_type()
        return str(
            invalid_argument(
                match.group(1),
                match.group(2),
                {"int": "an integer", "float": "a number", "bool": "true or false"}.get(kind, kind),
            )
        )
    return str(error)


def parse_flags(argv: Sequence[str]) -> list[str]:
    """Parses the flags in ``argv`` (absl's ``flags_parser``); exits 2 with one line on a bad flag.

    Returns:
        ``argv`` without its flags: ``[program, COMMAND, args after --...]``.
    """
    try:
        return FLAGS(list(argv))
    except flags.Error as e:
        command = next((a for a in argv[1:] if not a.startswith("-")), "")
        print(
            f"tfdist{' ' + command if command in COMMANDS else ''}: error: {_flag_error(e)}",
            file=sys.stderr,
        )
        sys.exit(2)


def main(argv: Sequence[str]) -> int:
    """Dispatches ``tfdist COMMAND [flags] [-- args]`` (flags already parsed).

    Returns:
        The exit code: 2, after one ``tfdist COMMAND: error: Invalid value for
        argument ...`` line on stderr, for a bad argument.
    """
    if len(argv) < 2 or argv[1] not in COMMANDS:
        received = argv[1] if len(argv) > 1 else None
        print(f"tfdist: error: {invalid_argument('command', received, COMMANDS)}", file=sys.stderr)
        return 2
    # Before anything imports TensorFlow, which reads it once. Launched tasks inherit it.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", QUIET_TF_CPP_MIN_LOG_LEVEL)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "tensorflow"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return {"train": _train, "launch": _launch, "bench": _bench, "manifest": _manifest}[
            argv[1]
        ](argv[2:])
    except ValueError as e:
        if str(e).startswith("Invalid value for argument"):
            print(f"tfdist {argv[1]}: error: {e}", file=sys.stderr)
            return 2
        raise


def run() -> None:
    """Console-script entry point."""
    app.run(main, flags_parser=parse_flags)
