"""One conversion of a logs dict (tensors, NumPy values) to Python floats; logs computed on read.

A leaf module (NumPy only, no TensorFlow import): the runners in
``tfdist.strategies``, the training loop and the launch engines all import it
without an import circle, and ``tfdist launch`` stays TensorFlow-free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np


def as_floats(logs: Mapping[str, Any]) -> dict[str, float]:
    """Returns ``logs`` with every value as a Python ``float``.

    Args:
        logs: Metric name to a scalar: an eager ``tf.Tensor``, a NumPy value,
            or a Python number.

    Returns:
        A new dict, in the same key order.
    """
    # np.asarray reads an eager tensor without a device copy of its own and accepts plain
    # numbers and NumPy scalars alike; float() then fails loudly on a non-scalar.
    return {name: float(np.asarray(value)) for name, value in logs.items()}


class _Pending:
    """The stand-in value of a `LazyLogs` key before its value is computed."""

    def __repr__(self) -> str:
        return "<not computed>"


_PENDING = _Pending()


class LazyLogs(dict):
    """A logs dict whose values are computed the first time one is read.

    Some logs cost work to compute (under parameter_server, the metric results
    from the summed state of the finished steps), and most batches' logs are
    never read: without a progress bar or a callback that reads batch logs,
    nothing looks at them. The keys are known up front, so ``len``, ``bool``,
    ``in`` and the keys compute nothing; any other access (a value,
    ``items()``, ``dict(logs)``, ``==``, ``repr``, JSON, a change, a copy,
    pickling) computes every value once, and from then on this is a plain
    ``dict`` of floats. Until then the dict holds each key with a stand-in
    that is not a number, so code that reads a dict's storage without its
    methods fails loudly rather than seeing a wrong value.

    Args:
        keys: The names the logs will have, in order.
        compute: Returns the logs: Python floats under exactly ``keys``.
    """

    def __init__(self, keys: Iterable[str], compute: Callable[[], Mapping[str, float]]) -> None:
        super().__init__(dict.fromkeys(keys, _PENDING))
        self._compute: Callable[[], Mapping[str, float]] | None = compute

    @property
    def computed(self) -> bool:
        """Whether the values have been computed (something read them)."""
        return self._compute is None

    def _fill(self) -> None:
        compute = self._compute
        if compute is not None:
            dict.update(self, compute())
            self._compute = None

    def __iter__(self) -> Iterator[str]:
        # Overridden (the same keys), so that dict(logs) and {**logs} read the values through
        # __getitem__ instead of copying the dict's storage.
        return dict.__iter__(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (list(self.items()),))  # a copy or a pickle is a plain dict


def _filled(name: str) -> Callable[..., Any]:
    """``dict``'s method ``name``, on a `LazyLogs` whose values are computed first."""
    method = getattr(dict, name)

    def filled(self: LazyLogs, *args: Any, **kwargs: Any) -> Any:
        self._fill()
        return method(self, *args, **kwargs)

    filled.__name__ = name
    return filled


# Every dict method that reads or changes a value computes the values first.
for _name in (
    "__getitem__ get values items __eq__ __ne__ __repr__ __or__ __ror__ __ior__ __setitem__ "
    "__delitem__ copy pop popitem setdefault update clear"
).split():
    setattr(LazyLogs, _name, _filled(_name))
LazyLogs.__str__ = LazyLogs.__repr__  # type: ignore[method-assign]
