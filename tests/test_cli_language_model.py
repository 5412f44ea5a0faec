"""``tfdist train --model=gpt``: a byte-level GPT on python_source from the command line (issue
44): its defaults, its refusals, and one tiny run in this process that prints bits per byte per
epoch, a sample of text and the final line."""

from __future__ import annotations

import re

import pytest

from tests.helpers import train_config_of

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


def test_a_tiny_gpt_run_prints_bits_per_byte_a_sample_and_the_final_line(capsys):
    from tfdist import cli

    cli.FLAGS.unparse_flags()
    capsys.readouterr()
    try:
        code = cli.main(cli.parse_flags(["tfdist", *TINY]))
    finally:
        cli.FLAGS.unparse_flags()
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    epochs = re.findall(r"loss: [\d.]+ .*val_bits_per_byte: ([\d.]+)", out)
    assert len(epochs) == 2, out[-3000:]
    assert re.search(r"^sample:\ndef ", out, flags=re.M), out[-3000:]
    final = re.search(
        r"^final val_accuracy=[\d.]+ val_loss=([\d.]+) val_bits_per_byte=([\d.]+) ", out, re.M
    )
    assert final, out[-3000:]
    val_loss, bits = map(float, final.groups())
    assert bits == pytest.approx(float(epochs[-1]), abs=1e-4)
    assert bits == pytest.approx(val_loss / 0.6931471805599453, rel=1e-3)
    assert bits < 8.0  # below uniform over 256 bytes: it learned something
    assert re.search(r"^final updates=6 weights_digest=[0-9a-f]{16}$", out, re.M)
