"""TensorFlow internals the benchmarks read, each behind a named function.

``tfdist bench`` only reports these (in a result's ``cpu`` block); nothing it
measures depends on them, so each returns None when the internal is gone.
"""

from __future__ import annotations


def onednn_enabled() -> bool | None:
    """Whether TF runs its oneDNN (MKL) CPU kernels; None if this TF cannot say.

    Reason: TF has no public query; ``tf.sysconfig.get_build_info()`` lists
    CUDA/ROCm only. TF enables oneDNN by default on x86 Linux, and
    ``TF_ENABLE_ONEDNN_OPTS=0`` turns it off, which is what this reports.
    """
    try:
        from tensorflow.python.util import _pywrap_util_port

        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return None
