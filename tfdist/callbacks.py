"""Keras callbacks from tfdist that also work with plain ``model.fit``."""

from tfdist.training.callbacks import BackupAndRestore

__all__ = ["BackupAndRestore"]
