"""Starting processes: ``tfdist launch``, ``notebook_launcher``, ``ray_launcher``, manifests.

Engines start processes that call tfdist's public API; none reaches into training.
Start reading at ``local.py``, what ``tfdist launch`` runs; it ties the others together:

* ``local.py``: ``launch()``, and ``run()``, which takes its arguments as one `LaunchSpec`;
* ``tasks.py``: a task's name, TF_CONFIG and environment, and how it ended; `LaunchSpec`,
  one launch whole, which the layout and the supervisor read;
* ``layout.py``: the cluster on one machine, or over the ``--hosts`` nodes;
* ``pinning.py``: each local task's CPUs and TF thread pools;
* ``isolation/``: the namespaces the tasks run in (a private network, no orphans),
  with the standard-library helper that makes them (see its map);
* ``supervisor.py``: spawn, watch, restart and stop the tasks' processes;
* ``restarts.py``: the restart policy, what happens when a task fails;
* ``preload.py``: ``--preload``, one interpreter imports TensorFlow once and every task
  is forked from it; ``_zygote.py``: that interpreter (``python -m tfdist.launch._zygote``);
* ``notebook.py``: ``notebook_launcher``, ``launch()`` around a pickled function;
  ``_notebook_task.py``: what each of its tasks runs;
* ``manifests/``: ``tfdist manifest``: Slurm (sbatch) and Kubernetes (YAML) job files;
  ``slurm_pin.py``: each Slurm task's CPUs and TF thread pools;
* ``ray/``: Ray Train as the engine (``ray_launcher``, ``ray_fit``, ``RayBackup``);
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
