"""Starting processes: ``tfdist launch``, ``notebook_launcher`` and cluster manifests."""
from tfdist.launch.notebook import notebook_launcher

__all__ = ["notebook_launcher"]
