"""The one interface of cluster environments: each detects itself and builds the cluster.

Modelled on Lightning Fabric's ``ClusterEnvironment.detect()``: the launcher and the strategies do
not know which scheduler started them; `tfdist.cluster.from_environment` asks each
environment in turn.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping

from tfdist.cluster.info import ClusterInfo


class ClusterEnvironment(abc.ABC):
    """A way a process learns its cluster from its environment variables.

    Implementations: `tfdist.cluster.TFConfigEnvironment` (TF_CONFIG, which Kubernetes
    jobs and ``tfdist launch`` set) and `tfdist.cluster.SlurmEnvironment` (``srun``).
    They read only the mapping they are given (``os.environ`` in practice), import no
    TensorFlow, and raise one ``ValueError`` worded by `tfdist.config.invalid_argument`
    for malformed variables.
    """

    name: str = ""  # For logs, e.g. "TF_CONFIG" or "Slurm".

    @abc.abstractmethod
    def detect(self, environ: Mapping[str, str]) -> bool:
        """True when ``environ`` places this process in a cluster of this kind.

        May raise for a process that is in such an environment but cannot be a task of
        it (e.g. a Slurm batch script of several tasks that was not started by ``srun``).
        """

    @abc.abstractmethod
    def cluster_info(self, environ: Mapping[str, str]) -> ClusterInfo:
        """The validated cluster and this task; call it only when `detect` is True."""
