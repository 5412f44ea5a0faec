"""The training loop, the replica step, precision, and callbacks."""
from tfdist.training.trainer import Trainer

__all__ = ["Trainer"]
