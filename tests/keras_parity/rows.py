"""Every parity row, gathered from the ``rows_*.py`` modules beside this one."""

import importlib
import pathlib

ROWS = []
for _path in sorted(pathlib.Path(__file__).parent.glob("rows_*.py")):
    ROWS.extend(importlib.import_module(f"tests.keras_parity.{_path.stem}").ROWS)
_names = [r.name for r in ROWS]
assert len(_names) == len(set(_names)), "parity row names must be unique"
