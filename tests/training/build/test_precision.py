"""Precision: device detection (CPU flags and GPUs mocked), `auto`, and the slow-policy warning."""

import dataclasses
import logging

import keras
import numpy as np
import pytest

import tfdist
from tfdist.config import TrainConfig
from tfdist.training.build import precision as precision_lib
AVX2_EPYC = frozenset({"sse4_2", "avx", "avx2", "fma"})
AVX512_BF16 = AVX2_EPYC | {"avx512f", "avx512_bf16"}
SAPPHIRE_RAPIDS = AVX2_EPYC | {"avx512f", "amx_bf16", "amx_fp16", "avx512_fp16"}


@pytest.fixture(autouse=True)
def _fresh_warnings():
    precision_lib.forget_slow_policy_warnings()
    yield
    precision_lib.forget_slow_policy_warnings()


@pytest.mark.parametrize(
    "gpus, flags, native, auto",
    [
        ([], AVX2_EPYC, set(), "float32"),
        ([], AVX512_BF16, {"mixed_bfloat16"}, "mixed_bfloat16"),
        ([], SAPPHIRE_RAPIDS, {"mixed_bfloat16", "mixed_float16"}, "mixed_bfloat16"),
        (
            [],
            frozenset({"avx512_fp16"}),
            {"mixed_float16"},
            "float32",
        ),  # TF's CPU float16 kernels stay slow
        ([(6, 1)], AVX512_BF16, set(), "float32"),  # the GPU decides, not the host CPU
        ([(7, 0)], AVX2_EPYC, {"mixed_float16"}, "mixed_float16"),
        (
            [(7, 5), (8, 0)],
            AVX2_EPYC,
            {"mixed_float16"},
            "mixed_float16",
        ),  # the slowest GPU sets the pace
        ([(8, 0)], AVX2_EPYC, {"mixed_float16", "mixed_bfloat16"}, "mixed_bfloat16"),
        ([(9, 0)], AVX2_EPYC, {"mixed_float16", "mixed_bfloat16"}, "mixed_bfloat16"),
    ],
)
def test_detection_and_auto(gpus, flags, native, auto):
    support = precision_lib.device_support(gpu_capabilities=gpus, flags=flags)
    assert support.native == native
    assert set(support.missing) == {"mixed_float16", "mixed_bfloat16"} - native
    assert precision_lib.auto_precision(support) == auto
    assert precision_lib.resolve_precision("auto", support=support) == auto


def test_cpu_flags_are_read_from_proc_cpuinfo(monkeypatch, tmp_path):
    import builtins

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\n")
    real_open = builtins.open
    monkeypatch.setattr(
        builtins,
        "open",
        lambda f, *a, **k: real_open(cpuinfo if f == "/proc/cpuinfo" else f, *a, **k),
    )
    assert precision_lib.cpu_flags() == {"fpu", "avx2", "avx512_bf16"}


def test_slow_policy_warns_once_on_the_chief_with_the_way_out(caplog):
    support = precision_lib.device_support(gpu_capabilities=[], flags=AVX2_EPYC)
    with caplog.at_level(logging.WARNING, logger=precision_lib.__name__):
        assert (
            precision_lib.resolve_precision("mixed_bfloat16", support=support) == "mixed_bfloat16"
        )
        precision_lib.resolve_precision("mixed_bfloat16", support=support)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "slower than float32" in warnings[0] and "avx512_bf16" in warnings[0]
    assert "precision='float32'" in warnings[0] and "precision='auto'" in warnings[0]


def test_no_warning_off_the_chief_or_where_native(caplog):
    slow = precision_lib.device_support(gpu_capabilities=[], flags=AVX2_EPYC)
    fast = precision_lib.device_support(gpu_capabilities=[], flags=AVX512_BF16)
    with caplog.at_level(logging.WARNING, logger=precision_lib.__name__):
        precision_lib.resolve_precision("mixed_bfloat16", support=slow, is_chief=False)
        precision_lib.resolve_precision("mixed_bfloat16", support=fast)
        precision_lib.resolve_precision("float32", support=slow)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_old_gpu_float16_warning_names_tensor_cores(caplog):
    support = precision_lib.device_support(gpu_capabilities=[(6, 1)], flags=AVX512_BF16)
    with caplog.at_level(logging.WARNING, logger=precision_lib.__name__):
        precision_lib.resolve_precision("mixed_float16", support=support)
    assert "compute capability 6.1" in caplog.text and "tensor cores" in caplog.text


def test_trainer_resolves_auto_for_this_machine(monkeypatch):
    real = precision_lib.device_support
    monkeypatch.setattr(
        precision_lib, "device_support", lambda: real(gpu_capabilities=[], flags=AVX512_BF16)
    )
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    trainer = tfdist.Trainer(
        lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]),
        strategy=strategy,
        loss="mse",
        precision="auto",
    )
    assert trainer.precision == "mixed_bfloat16"
    assert trainer.model.dtype_policy.name == "mixed_bfloat16"


def test_auto_is_a_valid_cli_precision():
    assert TrainConfig(precision="auto").precision == "auto"
    with pytest.raises(
        ValueError, match="Expected one of: auto, float32, mixed_bfloat16, mixed_float16"
    ):
        TrainConfig(precision="fp8")


def test_bf16_transformer_with_embedding_rows_equals_keras_own_mirrored_strategy():
    """mixed_bfloat16, Adam, a causal transformer LM with an embedding: the Trainer on mirrored
    x2 gives the weights of Keras's own ``fit`` under the same MirroredStrategy and policy.
    (Against one device bf16 moves both alike, by 1e-2 here: each replica rounds its half
    batch's activations on its own.)"""
    from tests.keras_parity.parity import run_trainer
    from tests.keras_parity.rows_transformers import ROWS

    row = next(r for r in ROWS if r.name == "transformers_lm_adam")
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        with strategy.scope():
            keras.utils.set_random_seed(0)
            reference = row.model()
            reference.compile(**row.compile())
        reference.fit(**row.fit(), verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    ours = run_trainer(dataclasses.replace(row, trainer={"precision": "mixed_bfloat16"}), strategy)
    for a, b in zip(reference.get_weights(), ours.weights):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
