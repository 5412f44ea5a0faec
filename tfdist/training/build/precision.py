"""Mixed precision: the Keras dtype policy, fp16 loss scaling, and what the device runs fast.

Mixed precision only pays where the hardware computes in 16 bits natively.
Elsewhere TF emulates it and training gets *slower*: ``tfdist bench`` measured
``mixed_bfloat16`` at 0.77x float32 on an AVX2-only AMD EPYC (bf16 matmul peak
0.79x fp32), and 1.95x on an AVX512-BF16 CPU. So `resolve_precision`
warns (on the chief) when the asked-for policy has no native support, and
``precision="auto"`` picks the fastest policy that is exact enough:

* GPU with compute capability >= 8.0: ``mixed_bfloat16`` (no loss scaling);
* GPU with compute capability >= 7.0: ``mixed_float16`` (tensor cores, loss scaling);
* CPU with ``avx512_bf16`` or ``amx_bf16``: ``mixed_bfloat16``;
* anything else: ``float32``.

A model already made keeps its own policy under ``auto``. With
``mixed_float16`` (dynamic loss scaling), losses are scaled before the
backward pass and the summed gradients unscaled once per update; an update
whose gradients are not finite is skipped (the loss scale halves) and counted
in the logs as ``skipped_updates``, next to ``loss_scale``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator, Sequence
from typing import Literal

import keras
import tensorflow as tf

from tfdist.config import PRECISIONS, check_choice, invalid_argument

logger = logging.getLogger(__name__)

Precision = Literal["auto", "float32", "mixed_float16", "mixed_bfloat16"]

#: CPU flags (``/proc/cpuinfo``) of native 16-bit matmul units.
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
CPU_FP16_FLAGS = ("avx512_fp16", "amx_fp16")


def check_precision(precision: str) -> str:
    """Validates a precision name (``auto`` included)."""
    return check_choice("precision", precision, PRECISIONS)


@dataclasses.dataclass(frozen=True)
class DeviceSupport:
    """Which mixed policies a device runs natively, and why.

    Attributes:
        device: What was inspected, e.g. ``"GPU (compute capability 8.6)"`` or ``"CPU"``.
        native: The mixed policies with native hardware support.
        missing: Per unsupported mixed policy, why it is not native.
    """

    device: str
    native: frozenset[str]
    missing: dict[str, str]


def cpu_flags() -> frozenset[str]:
    """This machine's CPU feature flags (empty where ``/proc/cpuinfo`` is unavailable)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def gpu_compute_capabilities() -> list[tuple[int, int]]:
    """The compute capability of each visible GPU (empty without GPUs)."""
    capabilities = []
    for gpu in tf.config.list_physical_devices("GPU"):
        capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
        if capability:
            capabilities.append(tuple(capability))
    return capabilities


def device_support(
    *,
    gpu_capabilities: Sequence[tuple[int, int]] | None = None,
    flags: frozenset[str] | None = None,
) -> DeviceSupport:
    """Inspects the device training runs on: the GPUs if there are any, else the CPU.

    Args:
        gpu_capabilities: Compute capabilities to judge instead of the visible GPUs'.
        flags: CPU flags to judge instead of this machine's.
    """
    gpus = gpu_compute_capabilities() if gpu_capabilities is None else list(gpu_capabilities)
    if gpus:
        cc = min(gpus)  # the slowest GPU sets the pace of a synchronous step
        name = f"GPU (compute capability {cc[0]}.{cc[1]})"
        missing = {}
        if cc < (7, 0):
            missing["mixed_float16"] = (
                f"this {name} has no tensor cores (they need compute capability >= 7.0)"
            )
        if cc < (8, 0):
            missing["mixed_bfloat16"] = (
                f"this {name} has no native bfloat16 (it needs compute capability >= 8.0)"
            )
        return DeviceSupport(
            name, frozenset({"mixed_float16", "mixed_bfloat16"} - set(missing)), missing
        )
    flags = cpu_flags() if flags is None else flags
    missing = {}
    if not flags & set(CPU_BF16_FLAGS):
        missing["mixed_bfloat16"] = (
            "this CPU has no native bfloat16 (no avx512_bf16 or amx_bf16 flag), so TF "
            "emulates it (measured 0.77x float32 on an AVX2-only AMD EPYC)"
        )
    if not flags & set(CPU_FP16_FLAGS):
        missing["mixed_float16"] = (
            "this CPU has no native float16 (no avx512_fp16 or amx_fp16 flag), so TF emulates it"
        )
    return DeviceSupport(
        "CPU", frozenset({"mixed_float16", "mixed_bfloat16"} - set(missing)), missing
    )


def auto_precision(support: DeviceSupport) -> str:
    """The fastest exact-enough policy for a device: bfloat16 (no loss scaling), then float16."""
    for precision in ("mixed_bfloat16", "mixed_float16"):
        if precision in support.native and (
            support.device != "CPU" or precision == "mixed_bfloat16"
        ):
            return precision
    return "float32"


_warned: set[tuple[str, str]] = set()  # (precision, device) already warned about, once per process


def forget_slow_policy_warnings() -> None:
    """Lets `resolve_precision` warn again about a slow policy (it warns once per process)."""
    _warned.clear()


def resolve_precision(
    precision: str, *, is_chief: bool = True, support: DeviceSupport | None = None
) -> str:
    """Validates ``precision``, resolves ``auto``, and warns once if it will be slow here.

    Args:
        precision: A name from ``tfdist.config.PRECISIONS``.
        is_chief: Only the chief logs.
        support: The device's support; default `device_support` of this machine.

    Returns:
        The concrete policy: ``float32``, ``mixed_float16`` or ``mixed_bfloat16``.
    """
    check_precision(precision)
    if precision == "float32":
        return precision
    support = support or device_support()
    if precision == "auto":
        chosen = auto_precision(support)
        if is_chief:
            logger.info("precision='auto' picked %r for this %s.", chosen, support.device)
        return chosen
    reason = support.missing.get(precision)
    if reason and is_chief and (precision, support.device) not in _warned:
        _warned.add((precision, support.device))
        logger.warning(
            "precision=%r will likely train slower than float32: %s. Use precision='float32', or "
            "precision='auto' to pick the fastest exact-enough policy for the device (here %r).",
            precision,
            reason,
            auto_precision(support),
        )
    return precision


@contextlib.contextmanager
def dtype_policy(precision: str) -> Iterator[None]:
    """Sets Keras's global dtype policy for the block, then restores it.

    Layers built inside the block compute in ``precision``'s compute dtype and
    keep float32 variables.
    """
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def check_model_policy(model: keras.Model, precision: str) -> None:
    """Raises if an already-built model was built under another policy."""
    name = getattr(model.dtype_policy, "name", str(model.dtype_policy))
    if precision != "float32" and name != precision:
        raise invalid_argument(
            "precision",
            precision,
            f"the dtype policy the model was built with ({name!r})",
            note="Pass a zero-arg builder as `model` so tfdist builds it under the policy.",
        )


def needs_loss_scaling(precision: str) -> bool:
    """float16 gradients underflow without loss scaling; bfloat16 and float32 don't."""
    return precision == "mixed_float16"


def wrap_optimizer(
    optimizer: keras.optimizers.Optimizer, precision: str
) -> keras.optimizers.Optimizer:
    """Wraps ``optimizer`` in a dynamic ``LossScaleOptimizer`` for mixed_float16.

    Must run inside the strategy scope.
    """
    if needs_loss_scaling(precision) and not isinstance(
        optimizer, keras.optimizers.LossScaleOptimizer
    ):
        return keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
