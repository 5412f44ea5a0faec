"""Job files for clusters that start the processes themselves: Slurm and Kubernetes.

This is what ``tfdist manifest`` runs::

    tfdist manifest slurm --nnodes=2 --workers=4 --output=job.sbatch -- \\
        tfdist train --strategy=multi_worker
    tfdist manifest kubernetes --workers=2 --ps=1 --chief --image=IMAGE --output=job.yaml -- \\
        python train.py
    tfdist manifest kubernetes --kind=indexed-job --workers=4 --image=IMAGE -- python train.py

One module per cluster manager: `tfdist.launch.manifests.slurm` (an sbatch
script) and `tfdist.launch.manifests.kubernetes` (TFJob or Indexed Job
YAML). Nothing here talks to a cluster or imports TensorFlow; each function
returns the text (or dicts) to write.
"""

from __future__ import annotations

from tfdist.launch.manifests.kubernetes import (
    JOB_LABEL,
    KUBERNETES_KINDS,
    TF_PORT,
    indexed_job,
    kubernetes_manifest,
    tfjob,
    to_yaml,
)
from tfdist.launch.manifests.slurm import slurm_script

MANIFEST_KINDS = ("kubernetes", "slurm")  # `tfdist manifest KIND`

__all__ = [
    "MANIFEST_KINDS",
    "KUBERNETES_KINDS",
    "TF_PORT",
    "JOB_LABEL",
    "slurm_script",
    "tfjob",
    "indexed_job",
    "kubernetes_manifest",
    "to_yaml",
]
