"""Starting processes: ``tfdist launch``, ``notebook_launcher``, ``ray_launcher``, manifests.

Engines start processes that call tfdist's public API; none reaches into training:

* ``local.py``: ``launch()``, what ``tfdist launch`` runs; it ties together
  ``tasks.py`` (a task's name, TF_CONFIG, result), ``layout.py`` (the cluster
  on one machine or over ``--hosts``), ``pinning.py`` (each task's CPUs and TF
  thread pools), ``isolation.py`` (+ ``_sandbox.py``: the namespaces the tasks run
  in, and their CPUs) and ``supervisor.py`` (spawn, watch, restart, stop);
* ``notebook.py``: ``notebook_launcher``, ``launch()`` around a pickled function;
* ``manifests/``: ``tfdist manifest``: ``slurm.py`` (sbatch) and ``kubernetes.py`` (YAML);
* ``ray_engine.py``, ``ray_backup.py``: Ray Train as the engine;
* ``train.py``: the ``tfdist train`` job (the ``tfdist`` command itself is
  ``tfdist/cli/``, above this package); ``pipeline_flag.py``: its ``--pipeline``.

Importing this package imports no TensorFlow (the launcher only supervises
processes) and no Ray: ``ray_launcher``, ``ray_fit`` and ``RayBackup`` load
`tfdist.launch.ray.engine` / `tfdist.launch.ray.backup` when first touched.
"""

from __future__ import annotations

from tfdist._lazy import lazy_attributes
from tfdist.launch.notebook import notebook_launcher

__all__ = ["notebook_launcher", "ray_launcher", "ray_fit", "RayBackup"]
_LAZY = {
    "ray_launcher": "tfdist.launch.ray.engine:ray_launcher",
    "ray_fit": "tfdist.launch.ray.engine:ray_fit",
    "RayBackup": "tfdist.launch.ray.backup:RayBackup",
}

__getattr__, __dir__ = lazy_attributes(globals(), _LAZY)
