"""The tfdist command line: the default run, its errors, its logs and its imports."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, run_cli_in_process, run_tfdist, train_config_of


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """``tfdist train`` as ``make train`` runs it (no flag), with a model_dir, and with
    TF_CPP_MIN_LOG_LEVEL unset and no matplotlib font cache, as on a user's first run. Three
    tests read this one run."""
    model_dir = tmp_path_factory.mktemp("model")
    fresh = str(tmp_path_factory.mktemp("matplotlib"))  # no font cache yet, as on a first run
    proc = _cli_without_tf_log_level("train", f"--model_dir={model_dir}", MPLCONFIGDIR=fresh)
    return proc, model_dir


@pytest.mark.slow
def test_default_train_run(default_run):
    proc, _ = default_run
    assert proc.returncode == 0, proc.stdout[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("final val_accuracy=")][0]
    assert float(line.split("=")[1].split()[0]) >= 0.95
    assert "replicas=2" in line
    assert "Epoch 8/8" in proc.stdout


def test_train_saves_the_model(default_run):
    proc, model_dir = default_run
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (model_dir / "model.keras").exists()


@pytest.mark.parametrize(
    "args,pattern",
    [
        (
            ["train", "--strategy=mirored"],
            "argument `strategy`. Received: strategy='mirored'. Expected one of: auto",
        ),
        (
            ["train", "--precision=fp8"],
            "argument `precision`. Received: precision='fp8'. Expected one of: auto, float32",
        ),
        (
            ["train", "--global_batch_size=63"],
            "argument `global_batch_size`. Received: global_batch_size=63",
        ),
        (["train", "--model=vgg"], "argument `model`. Received: model='vgg'"),
        (["train", "--dataset=imagenet"], "argument `dataset`. Received: dataset='imagenet'"),
        (["train", "--epochs=0"], "argument `epochs`. Received: epochs=0"),
        (
            ["train", "--gradient_compression=bf16,fp16"],
            "argument `gradient_compression`. Received: gradient_compression='bf16,fp16'. "
            "Expected one value for `tfdist train`: none, bf16, fp16.",
        ),
        (
            ["fly"],
            "argument `command`. Received: command='fly'. Expected one of: train, launch, bench",
        ),
        (["launch", "--workers=2"], "launch needs a command after --"),
        (
            ["launch", "--host=10.1.2.3", "--", "true"],
            "argument `host`. Received: host='10.1.2.3'.*--allow_external",
        ),
    ],
)
def test_cli_errors(args, pattern):
    proc = run_tfdist(*args, timeout=120)
    assert proc.returncode != 0
    assert re.search(pattern, proc.stdout), proc.stdout[-2000:]
    assert "Traceback" not in proc.stdout


@pytest.mark.parametrize(
    "flag",
    ["--model=vgg", "--dataset=imagenet", "--precision=fp8", "--strategy=parameter_server"]
    + ["--pipeline=split_at=a+a"],
)
def test_bad_train_flags_fail_before_tensorflow_loads(flag):
    # The flags are checked first, so a typo costs no TensorFlow start-up (seconds).
    code = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('tensorflow loaded:', 'tensorflow' in sys.modules))\n"
        f"sys.argv = ['tfdist', 'train', {flag!r}]\n"
        "runpy.run_module('tfdist', run_name='__main__')\n"
    )
    proc = _run_python(code)
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert "Invalid value for argument" in proc.stdout
    assert "tensorflow loaded: False" in proc.stdout


def test_train_gives_gradient_compression_and_bucket_bytes_to_the_trainer(monkeypatch):
    import tfdist
    from tfdist.launch import train

    config = train_config_of(
        "--strategy=one_device",
        "--model=mlp",
        "--epochs=1",
        "--steps_per_epoch=2",
        "--global_batch_size=16",
        "--verbose=0",
        "--gradient_compression=bf16",
        "--bucket_bytes=4096",
    )
    assert (config.gradient_compression, config.bucket_bytes) == ("bf16", 4096)
    made = []

    class Recorded(tfdist.Trainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(tfdist, "Trainer", Recorded)
    # One replica: the exchange leaves compression out (nothing to send), and the run trains.
    summary = train.run(config)
    assert [t.exchange for t in made] == [
        tfdist.ExchangeOptions(compression="bf16", bucket_bytes=4096)
    ]
    assert summary["num_replicas"] == 1 and summary["updates"] == 2


@pytest.mark.parametrize(("flags", "per_call"), [((), 32), (("--steps_per_execution=4",), 4)])
def test_train_runs_the_trainers_auto_steps_per_execution_unless_told(flags, per_call, monkeypatch):
    """By default ``tfdist train`` runs as the Trainer does ("auto": 32 updates per call on a
    synchronous strategy, where one per call left a small model at half the raw loop's speed);
    ``--steps_per_execution=N`` gives N."""
    import tfdist
    from tfdist.launch import train

    config = train_config_of(
        "--strategy=one_device", "--model=mlp", "--epochs=1", "--steps_per_epoch=40",
        "--global_batch_size=16", "--verbose=0", *flags,
    )  # fmt: skip
    assert config.steps_per_execution == ("auto" if not flags else per_call)
    calls = []

    class Recorded(tfdist.Trainer):
        def fit(self, *args, **kwargs):
            history = super().fit(*args, **kwargs)
            calls.append(self.steps_per_execution)
            return history

    monkeypatch.setattr(tfdist, "Trainer", Recorded)
    assert train.run(config)["updates"] == 40
    assert calls == [per_call]


def test_train_gradient_compression_defaults_none_and_bad_values_name_the_argument():
    from tfdist.config import TrainConfig
    from tfdist.launch.train import exchange_options

    none = {"gradient_compression": None, "bucket_bytes": None, "sharding": None}  # the defaults
    assert exchange_options(train_config_of()) == none
    assert exchange_options(train_config_of("--gradient_compression=none")) == none
    assert TrainConfig(gradient_compression="fp16").gradient_compression == "fp16"
    with pytest.raises(
        ValueError,
        match=re.escape(
            "argument `gradient_compression`. Received: gradient_compression='int8'. "
            "Expected one of: bf16, fp16, none."
        ),
    ):
        TrainConfig(gradient_compression="int8")
    with pytest.raises(
        ValueError,
        match=re.escape(
            "argument `bucket_bytes`. Received: bucket_bytes=0. "
            "Expected a positive integer or None."
        ),
    ):
        train_config_of("--bucket_bytes=0")
    with pytest.raises(ValueError, match=r"argument `gradient_compression`.*Expected one value"):
        train_config_of("--gradient_compression=")  # an empty list: not one value either


def test_train_local_sgd_flag_builds_the_trainers_option():
    """``--local_sgd``: plain averaging, DiLoCo's Nesterov SGD(0.7, 0.9) or the numbers given;
    ``adapt_to_stragglers=true``, on multi_worker only with ``--stragglers=off``;
    ``fragments=K``, a divisor of ``sync_every``, not beside adapting (each refused by name)."""
    from tfdist.launch.train import local_sgd_options

    assert local_sgd_options(train_config_of()) is None
    plain = local_sgd_options(train_config_of("--local_sgd=sync_every=8"))
    assert plain.sync_every == 8 and plain.outer_optimizer is None
    diloco = local_sgd_options(train_config_of("--local_sgd=sync_every=16,outer=nesterov"))
    outer = diloco.outer_optimizer.get_config()
    assert (outer["learning_rate"], outer["momentum"], outer["nesterov"]) == pytest.approx(
        (0.7, 0.9, True)
    )
    flag = "--local_sgd=sync_every=2,outer=sgd,outer_learning_rate=0.5,outer_momentum=0.3"
    outer = local_sgd_options(train_config_of(flag)).outer_optimizer.get_config()
    assert (outer["learning_rate"], outer["momentum"], outer["nesterov"]) == pytest.approx(
        (0.5, 0.3, False)
    )
    adapt = "--local_sgd=sync_every=4,adapt_to_stragglers=true"
    assert local_sgd_options(train_config_of(adapt)).adapt_to_stragglers  # mirrored: allowed
    with pytest.raises(ValueError, match="adapt_to_stragglers=false unless --stragglers=off"):
        train_config_of(adapt, "--strategy=multi_worker")
    config = train_config_of(adapt, "--strategy=multi_worker", "--stragglers=off")
    assert local_sgd_options(config).adapt_to_stragglers
    streaming = "--local_sgd=sync_every=16,fragments=4,outer=nesterov"
    assert local_sgd_options(train_config_of(streaming)).fragments == 4
    assert plain.fragments == 1
    for pairs, expected in (
        ("sync_every=16,fragments=3", "fragments= a positive divisor of sync_every"),
        ("sync_every=4,fragments=8", "fragments= a positive divisor of sync_every"),
        ("sync_every=4,fragments=0", "fragments= a positive divisor of sync_every"),
        ("sync_every=4,fragments=two", "fragments= to be an integer"),
        ("sync_every=4,fragments=2,adapt_to_stragglers=true", "fragments=1 with adapt_to_str"),
    ):
        with pytest.raises(ValueError, match=r"argument `local_sgd`.*Expected " + expected):
            train_config_of(f"--local_sgd={pairs}")


def test_bench_time_to_accuracy_tasks_reach_the_benchmark_or_are_refused(monkeypatch, capsys):
    from tfdist.bench import runner
    from tfdist.bench.time_to_accuracy import tasks as time_to_accuracy_tasks
    from tfdist.cli.flag_definitions import TIME_TO_ACCURACY_TASKS

    # The names the CLI checks before TensorFlow loads are the benchmark's tasks.
    assert TIME_TO_ACCURACY_TASKS == tuple(time_to_accuracy_tasks.TASKS) == ("digits", "patterns")
    given = []

    def run(names, **kwargs):
        given.append(kwargs["options"]["time_to_accuracy_tasks"])
        return {"meta": {}, "results": {}}

    monkeypatch.setattr(runner, "run", run)
    bench = ["bench", "--benchmarks=time_to_accuracy"]
    for flag in ([], ["--time_to_accuracy_tasks=patterns,digits,patterns"]):
        code, err = run_cli_in_process(bench + flag, capsys)
        assert code == 0, err
    assert given == [None, ("patterns", "digits")]  # None: the benchmark's default, both
    for value, received, unknown in (
        ("", "''", ""),
        ("digits,imagenet", "'digits,imagenet'", "'imagenet'"),
    ):
        code, err = run_cli_in_process(bench + [f"--time_to_accuracy_tasks={value}"], capsys)
        assert code == 2 and err.count("\n") == 1, err
        assert err.startswith(
            "tfdist bench: error: Invalid value for argument `time_to_accuracy_tasks`. "
            f"Received: time_to_accuracy_tasks={received}. "
            "Expected one or more of: digits, patterns, comma-separated."
        ), err
        assert (f"Unknown: {unknown}." in err) is bool(unknown), err
        # The benchmark's own check (from Python) refuses it in the same words.
        with pytest.raises(ValueError) as refused:
            time_to_accuracy_tasks.check_tasks(value.split(",") if value else [])
        assert err.strip() == f"tfdist bench: error: {refused.value}"
    assert len(given) == 2  # refused before the benchmark ran


def test_manifest_slurm_writes_the_script(tmp_path):
    out = tmp_path / "job.sbatch"
    proc = run_tfdist(
        "manifest",
        "slurm",
        "--nnodes=2",
        "--workers=4",
        "--partition=gpu",
        "--time=01:00:00",
        f"--output={out}",
        "--",
        "tfdist",
        "train",
        "--strategy=multi_worker",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert f"submit it with: sbatch {out}" in proc.stdout
    lines = out.read_text().splitlines()
    assert [line for line in lines if line.startswith("#SBATCH")] == [
        "#SBATCH --job-name=tfdist",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=01:00:00",
    ]
    # Each task pins itself first (tfdist.launch.slurm_pin), run by the Python that wrote it.
    assert (
        "srun --nodes=2 --ntasks-per-node=4 --kill-on-bad-exit=1 "
        f"{sys.executable} -m tfdist.launch.slurm_pin -- tfdist train --strategy=multi_worker"
        in lines
    )
    assert lines[-1] == 'exit "$rc"'


def test_launch_per_node_refuses_external_hosts():
    proc = run_tfdist(
        "launch",
        "--nnodes=2",
        "--node_rank=1",
        "--hosts=10.1.2.3:2222,10.1.2.4:2222",
        "--",
        "true",
        timeout=120,
    )
    assert proc.returncode == 2
    assert (
        "tfdist launch: error: Invalid value for argument `hosts`. "
        "Received: hosts=['10.1.2.3:2222', '10.1.2.4:2222']"
    ) in proc.stdout
    assert "--allow_external" in proc.stdout and "unauthenticated" in proc.stdout
    assert "Traceback" not in proc.stdout


def _run_python(code, **env):
    """Runs ``python -c CODE`` from the repo root (imports from this checkout), output merged."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": REPO, **env},
    )


def _cli_without_tf_log_level(*args, **env):
    """Runs ``python -m tfdist ARGS``; TF_CPP_MIN_LOG_LEVEL unset unless given (no user choice)."""
    full_env = {
        k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_CONFIG")
    }
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "tfdist", *args],
        cwd=REPO,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )


def test_cli_quiets_tf_cpp_logs_unless_the_user_set_the_level():
    show = ["launch", "--workers=1", "--", "sh", "-c", "echo level=$TF_CPP_MIN_LOG_LEVEL"]
    assert "[worker:0] level=3" in _cli_without_tf_log_level(*show).stdout
    assert "[worker:0] level=1" in _cli_without_tf_log_level(*show, TF_CPP_MIN_LOG_LEVEL="1").stdout


@pytest.mark.slow
def test_first_run_prints_no_tf_cpp_warnings_or_errors(default_run):
    """No "failed call to cuInit", "Local rendezvous is aborting", "... will not be optimized"."""
    proc, _ = default_run
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "final val_accuracy=" in proc.stdout
    cpp_lines = [line for line in proc.stdout.splitlines() if re.match(r"[IWE]0000 ", line)]
    assert cpp_lines == [], cpp_lines  # nor TF's import lines: oneDNN, "cuda drivers"
    assert "cuInit" not in proc.stdout and "rendezvous" not in proc.stdout
    assert "before absl::InitializeLog" not in proc.stdout
    assert "fontManager" not in proc.stdout and "font cache" not in proc.stdout  # matplotlib


def test_quiet_import_drops_only_tensorflows_import_lines(tmp_path):
    """C++ writes to the stderr descriptor: the known import lines go, everything else stays."""
    code = (
        "import os, sys\n"
        "from tfdist.quiet import IMPORT_NOISE, stderr_without\n"
        "with stderr_without(IMPORT_NOISE):\n"
        "    os.write(2, b'WARNING: All log messages before absl::InitializeLog() is called are "
        "written to STDERR\\n')\n"
        "    os.write(2, b'I0000 00:00:1796178238.520513   22152 cudart_stub.cc:31] Could not "
        "find cuda drivers on your machine, GPU will not be used.\\n')\n"
        "    os.write(2, b'E0000 00:00:17.5  1 some_kernel.cc:9] a real error\\n')\n"
        "    print('from python', file=sys.stderr)\n"
        "print('after', file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "E0000 00:00:17.5  1 some_kernel.cc:9] a real error",
        "from python",
        "after",
    ]


def test_launch_never_imports_tensorflow():
    """The launcher only supervises: neither the CLI's parsing nor `tfdist launch` imports TF.

    (TF held 770 MB in each launcher.)
    """
    code = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('launcher imported tensorflow:',\n"
        "                              'tensorflow' in sys.modules))\n"
        "sys.argv = ['tfdist', 'launch', '--workers=2', '--',\n"
        "            sys.executable, '-c', 'print(\"task ran\")']\n"
        "runpy.run_module('tfdist', run_name='__main__')\n"
    )
    proc = _run_python(code)
    assert proc.returncode == 0, proc.stdout
    assert "[worker:0] task ran" in proc.stdout and "[worker:1] task ran" in proc.stdout
    assert "launcher imported tensorflow: False" in proc.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["slurm", "--ntasks=2"],
        ["kubernetes", "--workers=2", "--image=img"],
        ["kubernetes", "--kind=indexed-job", "--workers=2", "--image=img"],
    ],
)
def test_manifest_never_imports_tensorflow(args):
    """`tfdist manifest` only writes text: no TensorFlow (nor Keras) is imported on its way."""
    code = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('manifest imported tensorflow:',\n"
        "                              'tensorflow' in sys.modules or 'keras' in sys.modules))\n"
        f"sys.argv = ['tfdist', 'manifest', *{args!r}, '--', 'tfdist', 'train']\n"
        "runpy.run_module('tfdist', run_name='__main__')\n"
    )
    proc = _run_python(code)
    assert proc.returncode == 0, proc.stdout
    assert ("srun " if args[0] == "slurm" else "apiVersion: ") in proc.stdout
    assert "manifest imported tensorflow: False" in proc.stdout


def test_import_tfdist_is_lazy_and_shims_come_first():
    code = (
        "import sys, tfdist\n"
        "from tfdist.launch import notebook_launcher, local\n"
        "from tfdist import cli\n"
        "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules, \\\n"
        "    'imported too early'\n"
        "# A direct import of a TF-using module...\n"
        "from tfdist.training.fit.chief_only import BackupAndRestore\n"
        "assert tfdist._shims_applied  # ...applies the compat shims first.\n"
        "print(tfdist.Trainer.__name__, tfdist.make_strategy.__name__,\n"
        "      tfdist.callbacks.BackupAndRestore.__name__,\n"
        "      callable(tfdist.data.load), callable(tfdist.models.get),\n"
        "      tfdist.launch.notebook_launcher.__name__)\n"
    )
    proc = _run_python(code, TF_CPP_MIN_LOG_LEVEL="2")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "Trainer make_strategy BackupAndRestore True True notebook_launcher" in proc.stdout


def _sample(name):
    """``--name=VALUE`` with a value of the flag's type (booleans: ``--name``)."""
    from tfdist.cli import FLAGS

    kind = FLAGS[name].flag_type()
    value = {"int": "1", "float": "1.0", "bool": None, "list": "1"}.get(kind, "x")
    return f"--{name}" if value is None else f"--{name}={value}"


def _not_read():
    from tfdist.cli.flag_definitions import READS, TFDIST_FLAGS
    from tfdist.cli.usage import COMMANDS

    return [(c, f) for c in COMMANDS for f in sorted(TFDIST_FLAGS) if f not in READS[c]]


@pytest.mark.parametrize("command,flag", _not_read())
def test_every_command_refuses_every_flag_it_does_not_read(command, flag, capsys):
    # Each flag given to each command that does not read it: one line, exit 2, nothing run.
    code, err = run_cli_in_process([command, _sample(flag), "--", "true"], capsys)
    assert code == 2, err
    assert err.startswith(f"tfdist {command}: error: Invalid value for argument `{flag}`."), err
    assert f"Expected no --{flag} for `tfdist {command}`. --{flag} is a flag of `tfdist " in err


@pytest.mark.parametrize("flag", ["cpus_per_worker", "max_restarts"])
def test_train_takes_rays_flags_only_with_the_ray_engine(flag, capsys):
    code, err = run_cli_in_process(["train", _sample(flag)], capsys)
    assert code == 2 and f"Expected no --{flag} without --engine=ray" in err, err


def test_every_flag_is_read_by_some_command_and_the_commands_read_what_they_say():
    """READS (what each command takes) is what each command's module reads from FLAGS."""
    import ast

    from tfdist.cli import flag_definitions
    from tfdist.cli.flag_definitions import READS, TFDIST_FLAGS

    assert set().union(*READS.values()) == TFDIST_FLAGS
    for command in READS:
        path = Path(REPO) / "tfdist" / "cli" / f"{command}_command.py"
        tree = ast.parse(path.read_text())
        attributes = {
            n.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and getattr(n.value, "id", None) == "FLAGS"
        }
        named = {
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and n.value in READS[command]
        }
        assert (attributes | named) & TFDIST_FLAGS == READS[command], command
    assert flag_definitions.RAY_ONLY_TRAIN_FLAGS
