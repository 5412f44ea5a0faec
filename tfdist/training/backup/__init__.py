"""Step-exact backups: what a restarted run needs to resume at the same update.

Start at ``fit_backups`` (what one fit backs up, and where it starts again).

- ``fit_backups``: ``FitBackups``: what a fit checkpoints, where it resumes, cleanup.
- ``writer``: the backup writer: position and weights in one checkpoint, in the background.
- ``files``: a backup directory's files: the atomic commit of ``state.json``, reading, cleanup.
- ``sync``: every worker resumes at the chief's backup: the ``Position``, agreed on.
"""
