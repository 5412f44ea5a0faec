"""Keras callbacks from tfdist that also work with plain ``model.fit``."""

from tfdist.training.fit.chief_only import BackupAndRestore

__all__ = ["BackupAndRestore"]
