"""Package attributes that import their module on first use (PEP 562 ``__getattr__``).

``tfdist``, ``tfdist.training`` and ``tfdist.launch`` name what they export in a
table and load it only when asked, so that importing the package imports no
TensorFlow (or Ray) until a name that needs it is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(
    namespace: dict[str, Any], table: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``(__getattr__, __dir__)`` for the names in ``table``.

    Args:
        namespace: The package's ``globals()``; a loaded name is kept there, so
            later lookups do not come back to ``__getattr__``.
        table: Name -> ``"module:attribute"``, or ``"module"`` for the module itself.
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module_name, _, attribute = table[name].partition(":")
        module = importlib.import_module(module_name)
        value = getattr(module, attribute) if attribute else module
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__
