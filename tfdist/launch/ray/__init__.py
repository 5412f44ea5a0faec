"""Ray Train as the engine for many machines.

- ``engine``: ``ray_launcher`` and ``tfdist train --engine=ray``.
- ``backup``: ``RayBackup``: tfdist's step-exact backups as Ray Train checkpoints.
"""
