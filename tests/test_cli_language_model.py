"""``tfdist train --model=gpt``: a byte-level GPT on python_source from the command line (issue
44): its defaults, its refusals, and tiny runs with every capability, sharing processes: in this
process the default (one device, with backups), a pipeline cut between the blocks and local SGD
on 2 mirrored replicas; in one launch of 2 multi_worker workers, balanced shares, sharded in
bf16 with accumulation (mirrored: tests/models/test_gpt.py, against Keras in bf16); in launches
of their own, the hybrid and a parameter-server cluster. Each prints bits per byte per epoch, a
sample of text and the final line."""

from __future__ import annotations

import logging
import re
import sys

import pytest

from tests.helpers import PRELOAD, launch_report, run_tfdist, train_config_of

#: A tiny run: 2 epochs of 3 updates of a 2-block GPT on 8 KB of text (the real defaults train
#: for minutes: docs/command-line.md).
TINY = ("train", "--model=gpt", "--epochs=2", "--steps_per_epoch=3", "--global_batch_size=8")
TINY += ("--seq_len=16", "--max_bytes=8000", "--model_options=width=16,depth=2,heads=2")
TINY += ("--warmup_steps=1",)


def test_gpt_defaults_fill_only_the_flags_not_given_and_leave_the_image_models_alone():
    from tfdist.cli.train_command import MODEL_DEFAULTS
    from tfdist.config import TrainConfig

    config = train_config_of("--model=gpt", "--epochs=3")
    defaults = MODEL_DEFAULTS["gpt"]
    assert config.epochs == 3 and config.dataset == "python_source"
    for name in ("steps_per_epoch", "global_batch_size", "learning_rate", "seq_len"):
        assert getattr(config, name) == defaults[name], name
    assert (config.strategy, config.model_options) == ("one_device", defaults["model_options"])
    assert train_config_of("--model=gpt", "--num_devices=2").strategy == "mirrored"
    pipeline = train_config_of("--model=gpt", "--pipeline=split_at=block_1")
    assert pipeline.strategy is None and pipeline.seq_len == defaults["seq_len"]
    assert train_config_of() == TrainConfig()  # the image models' defaults: the flags' own
    assert train_config_of("--model=mlp") == TrainConfig(model="mlp")


@pytest.mark.parametrize(
    "flags,message",
    [
        (
            ["--seq_len=64"],
            "`seq_len`. Received: seq_len=64. Expected no --seq_len with --dataset=digits",
        ),
        (["--model=gpt", "--seq_len=0"], "`seq_len`. Received: seq_len=0"),
        (
            ["--model=gpt", "--model_options=width"],
            "`model_options`. Received: model_options='width'",
        ),
        (["--model=gpt", "--model_options=depth=two"], "depth= to be an integer"),
    ],
)
def test_language_model_flags_are_refused_before_tensorflow_loads(flags, message, capsys):
    from tests.helpers import run_cli_in_process

    code, err = run_cli_in_process(["train", *flags], capsys)
    assert code == 2 and message in err, err


def _run_in_process(flags, capsys) -> str:
    """``tfdist train FLAGS`` through the CLI's own ``main`` in this process: its stdout."""
    from tfdist import cli

    cli.FLAGS.unparse_flags()
    capsys.readouterr()
    try:
        code = cli.main(cli.parse_flags(["tfdist", *flags]))
    finally:
        cli.FLAGS.unparse_flags()
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    return out


def _final_bits(out: str) -> float:
    """The chief's final ``val_bits_per_byte``, checked against its last epoch and its loss."""
    epochs = re.findall(r"loss: [\d.]+ .*val_bits_per_byte: ([\d.]+)", out)
    final = re.search(
        r"^(?:\[\w+:0\] )?final val_accuracy=[\d.]+ val_loss=([\d.]+) val_bits_per_byte=([\d.]+) ",
        out,
        re.M,
    )
    assert epochs and final, out[-3000:]
    val_loss, bits = map(float, final.groups())
    assert bits == pytest.approx(float(epochs[-1]), abs=1e-4)
    assert bits == pytest.approx(val_loss / 0.6931471805599453, rel=1e-3)
    assert bits < 8.0  # below uniform over 256 bytes: it learned something
    return bits


#: In this process: the default strategy (one_device) with a backup every 2 updates (written,
#: then removed after success); 2 pipeline stages cut between the blocks; local SGD over 2
#: mirrored replicas, averaged every 2 updates.
IN_PROCESS = {
    "one_device": ("--backup_dir={backup}", "--backup_freq=2"),
    "pipeline": ("--pipeline=split_at=block_0,micro_batches=2",),
    "local_sgd": ("--strategy=mirrored", "--num_devices=2", "--local_sgd=sync_every=2"),
}


@pytest.mark.parametrize("case", list(IN_PROCESS))
def test_a_tiny_gpt_run_prints_bits_per_byte_a_sample_and_the_final_line(
    case, tmp_path, capsys, caplog
):
    """Each run prints its bits per byte per epoch, a sample and the final line."""
    backup = tmp_path / "backup"
    flags = tuple(flag.format(backup=backup) for flag in IN_PROCESS[case])
    caplog.set_level(logging.DEBUG, logger="tfdist.training.backup.files")
    out = _run_in_process([*TINY, *flags], capsys)
    assert len(re.findall(r"loss: [\d.]+ .*val_bits_per_byte: ([\d.]+)", out)) == 2, out[-3000:]
    assert re.search(r"^sample:\ndef ", out, flags=re.M), out[-3000:]
    _final_bits(out)
    assert f" replicas={2 if case == 'local_sgd' else 1} " in out
    assert re.search(r"^final updates=6 weights_digest=[0-9a-f]{16}$", out, re.M)
    saves = re.findall(
        r"saved backup \S+ at Position\(epoch=\d+, step=\d+, updates=(\d+)", caplog.text
    )
    assert saves == (["2", "3", "4", "6"] if case == "one_device" else []), caplog.text[-3000:]
    assert not backup.exists()  # removed after success


#: One launch for what needs workers: 2 multi_worker workers, batch shares re-decided every 2
#: updates by the workers' speed, ZeRO-1 optimizer state, 2 micro-batches per update, bf16.
LAUNCHED = (*TINY[:2], *TINY[4:], "--strategy=multi_worker", "--balance=window=2")
LAUNCHED += ("--epochs=1", "--steps_per_epoch=8", "--accumulation_steps=2", "--verbose=2")
LAUNCHED += ("--sharding=optimizer", "--precision=mixed_bfloat16")


@pytest.mark.multiprocess
def test_two_workers_train_the_gpt_balanced_sharded_in_bf16_with_accumulation():
    """``tfdist launch --workers=2 -- tfdist train --model=gpt --strategy=multi_worker`` with
    those capabilities at once: both workers end with the same weights, the chief prints its
    figures and a sample."""
    proc = run_tfdist(
        "launch", "--workers=2", PRELOAD, "--", sys.executable, "-m", "tfdist", *LAUNCHED
    )
    assert proc.returncode == 0, launch_report(proc)
    out = proc.stdout
    finals = dict(re.findall(r"^\[worker:(\d)\] final updates=4 weights_digest=(\w+)$", out, re.M))
    assert set(finals) == {"0", "1"} and finals["0"] == finals["1"], launch_report(proc)
    chief = "\n".join(line for line in out.splitlines() if line.startswith("[worker:0]"))
    _final_bits(chief)
    assert " replicas=2 " in chief and "[worker:0] sample:" in chief
    assert "[worker:0] I" in out and "Sharding 'optimizer' over 2 replicas" in out


#: The capabilities that need launches of their own: the hybrid (2 multi_worker workers, each
#: 2 pipeline stages cut between the blocks) and a parameter-server cluster (a chief, 2
#: workers, 1 ps): ``tfdist launch`` flags, then ``tfdist train`` flags.
OWN_LAUNCHES = {
    "hybrid": (
        ("--workers=2",),
        ("--strategy=multi_worker", "--pipeline=split_at=block_0,micro_batches=2"),
    ),
    "parameter_server": (("--chief", "--workers=2", "--ps=1"), ("--strategy=parameter_server",)),
}


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", list(OWN_LAUNCHES))
def test_the_gpt_trains_as_the_hybrid_and_on_parameter_servers(case):
    """The tiny GPT on those launches: the chief alone prints its bits per byte, a sample and
    the final line."""
    launch_flags, train_flags = OWN_LAUNCHES[case]
    proc = run_tfdist(
        "launch",
        *launch_flags,
        PRELOAD,
        "--",
        sys.executable,
        "-m",
        "tfdist",
        *TINY,
        *train_flags,
        "--verbose=2",
        timeout=300,
    )
    assert proc.returncode == 0, launch_report(proc)
    chief_task = "chief:0" if case == "parameter_server" else "worker:0"
    finals = [line for line in proc.stdout.splitlines() if "final val_accuracy=" in line]
    assert len(finals) == 1 and finals[0].startswith(f"[{chief_task}]"), launch_report(proc)
    chief = "\n".join(x for x in proc.stdout.splitlines() if x.startswith(f"[{chief_task}]"))
    _final_bits(chief)
    assert f"[{chief_task}] sample:" in chief
