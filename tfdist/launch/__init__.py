"""Starting processes: ``tfdist launch``, ``notebook_launcher`` and cluster manifests.

Importing this package imports no TensorFlow (the launcher only supervises processes).
"""
from tfdist.launch.notebook import notebook_launcher

__all__ = ["notebook_launcher"]
