"""``tfdist --help``, ``tfdist COMMAND --help``, ``--version`` and the suggestions of bad flags."""

import re
import sys

import pytest

from tests.helpers import run_cli_in_process, run_tfdist


def _help(args, capsys):
    """``tfdist ARGS`` in-process: (exit code, stdout, stderr)."""
    from tfdist import cli

    cli.FLAGS.unparse_flags()
    capsys.readouterr()
    try:
        cli.parse_flags(["tfdist", *args])
        code = None  # no help asked for: the flags parsed
    except SystemExit as e:
        code = e.code
    finally:
        cli.FLAGS.unparse_flags()
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("args", [[], ["-h"], ["--help"], ["help"], ["--help", "--epochs=3"]])
def test_tfdist_alone_or_asking_for_help_lists_every_command_and_exits_0(args, capsys):
    from tfdist.cli.usage import COMMANDS

    code, out, err = _help(args, capsys)
    assert code == 0 and not err, err
    assert out.startswith("usage: tfdist COMMAND")
    for command in COMMANDS:
        assert re.search(rf"^  {command} +\w", out, flags=re.M), (command, out)


def _entries(text):
    """The flags a help text lists, one per entry (``  --name...`` at the start of a line)."""
    return set(re.findall(r"^  --(\w+)", text, flags=re.M))


def _shown(command):
    """The flags ``command --help`` lists: all it reads, but manifest's refused by every kind."""
    from tfdist.cli.flag_definitions import READS
    from tfdist.cli.manifest_command import UNUSED_FLAGS

    refused = set.intersection(*map(set, UNUSED_FLAGS.values())) if command == "manifest" else ()
    return READS[command] - set(refused)


@pytest.mark.parametrize("command", ["train", "launch", "manifest", "bench"])
@pytest.mark.parametrize("ask", ["-h", "--help", "help"])
def test_each_commands_help_gives_usage_an_example_and_exactly_its_own_flags(command, ask, capsys):
    from tfdist.cli import help as help_text

    args = ["help", command] if ask == "help" else [command, ask]
    code, out, err = _help(args, capsys)
    assert code == 0 and not err, err
    assert out.startswith(f"usage: tfdist {command}")
    assert "Examples:\n  tfdist " in out
    assert _entries(out) == _shown(command)
    grouped = [name for _, names in help_text.GROUPS[command] for name in names]
    assert len(grouped) == len(set(grouped)), "a flag listed in two groups"
    # A flag given a default shows it, in the words the flag takes.
    if command == "train":
        assert re.search(r"--strategy=STR +Distribution strategy: auto, one_device", out)
        assert "(default: mirrored)" in out and "(default: 8)" in out
    if command == "launch":
        assert re.search(r"--pin +Give each chief", out) and "(default: true)" in out


def test_bench_help_names_every_benchmark_and_they_are_the_runners():
    from tfdist.bench import runner
    from tfdist.bench.names import IN_PROCESS as IN_PROCESS_BENCHMARKS
    from tfdist.bench.names import LAUNCHING as LAUNCHING_BENCHMARKS
    from tfdist.cli import help as help_text

    # The one registry (which the CLI reads) names exactly the benchmarks that register.
    assert sorted(IN_PROCESS_BENCHMARKS + LAUNCHING_BENCHMARKS) == list(runner.available())
    assert set(LAUNCHING_BENCHMARKS) == set(runner.ON_REQUEST)
    text = " ".join(help_text.command_help("bench").split())
    for name in runner.available():
        assert name in text


def test_help_after_the_double_dash_is_the_launched_commands(capsys):
    code, _, _ = _help(["launch", "--", "python", "--help"], capsys)
    assert code is None  # parsed as a launch; `--help` belongs to the command


def test_version_prints_the_package_version(capsys):
    import tfdist

    for args in (["--version"], ["train", "--version"]):
        code, out, _ = _help(args, capsys)
        assert (code, out) == (0, f"tfdist {tfdist.__version__}\n")


@pytest.mark.parametrize(
    "args,suggestion",
    [
        (["train", "--strategi=mirrored"], "Did you mean --strategy?"),
        (["bench", "--quik"], "Did you mean --quick?"),
        (["launch", "--worker=2", "--", "true"], "Did you mean --workers?"),
    ],
)
def test_an_unknown_flag_suggests_only_that_commands_flags(args, suggestion, capsys):
    code, err = run_cli_in_process(args, capsys)
    assert code == 2 and suggestion in err, err
    assert f"Expected a flag of `tfdist {args[0]}` (see tfdist {args[0]} --help)" in err


def test_an_unknown_flag_never_suggests_abseils_own(capsys):
    # absl's --only_check_args was the suggestion for this before; train has no such flag.
    code, err = run_cli_in_process(["train", "--only_check_flags"], capsys)
    assert code == 2 and "Did you mean" not in err, err


def test_the_installed_command_prints_help_and_exits_0():
    proc = run_tfdist("--help", timeout=60)
    assert proc.returncode == 0 and "Commands:" in proc.stdout, proc.stdout
    proc = run_tfdist("train", "-h", timeout=60)
    assert proc.returncode == 0 and "--global_batch_size=INT" in proc.stdout, proc.stdout


def test_a_bad_benchmark_name_is_refused_before_tensorflow_loads():
    import subprocess

    code = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('tensorflow loaded:', 'tensorflow' in sys.modules))\n"
        "sys.argv = ['tfdist', 'bench', '--benchmarks=scalin']\n"
        "runpy.run_module('tfdist', run_name='__main__')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Received: benchmarks='scalin'. Expected one of: accumulation" in proc.stderr
    assert "tensorflow loaded: False" in proc.stdout


@pytest.mark.parametrize("as_json", [False, True])
def test_bench_prints_a_summary_table_or_with_json_the_json(as_json, capsys, monkeypatch):
    import json

    from tfdist import cli
    from tfdist.bench import runner

    results = {
        "meta": {"date": "D", "machine": "M", "repeats": 3, "files": ["out.json", "out.png"]},
        "results": {"accumulation": {"ratio": 0.97, "goal": ">= 0.95"}},
    }
    monkeypatch.setattr(runner, "run", lambda *args, **kwargs: results)
    cli.FLAGS.unparse_flags()
    try:
        argv = ["tfdist", "bench", "--benchmarks=accumulation"] + (["--json"] if as_json else [])
        assert cli.main(cli.parse_flags(argv)) == 0
    finally:
        cli.FLAGS.unparse_flags()
    out = capsys.readouterr().out
    if as_json:
        assert json.loads(out) == results
    else:
        assert "accumulation  with gradient accumulation / without, examples/s  0.97" in out
        assert out.rstrip().endswith("wrote out.json\nwrote out.png"), out
        assert ">= 0.95  yes" in out
