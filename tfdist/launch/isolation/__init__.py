"""Keeping a local launch's tasks to themselves: a private network, and no orphans.

* ``sandbox.py``: `Sandbox`, the namespaces one launch's tasks share (a private
  network with only loopback, a PID namespace that dies with the launcher) and
  how a task runs inside them; `report_exposure`, the warnings where none could be made.
  Start reading here;
* ``_helper.py``: the standard-library helper that makes the namespaces and runs
  each task in them, run by path (``python -I -S _helper.py hold|run ...``), never imported.

Importing this package imports no TensorFlow.
"""

from __future__ import annotations

from tfdist.launch.isolation.sandbox import UNAUTHENTICATED, Sandbox, report_exposure

__all__ = ["Sandbox", "UNAUTHENTICATED", "report_exposure"]
