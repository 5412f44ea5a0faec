"""What goes into the strategy scope before a fit: the model, its optimizer, metrics, policy.

Start at ``scope`` (``compile_in_scope``: everything built in the scope, in order).

- ``scope``: the model, its optimizer and its metrics built into the strategy scope.
- ``placement``: the user's model in the scope: as given, built there, or moved there.
- ``compiled``: a model the user compiled: its ``compile`` arguments taken, or used as is.
- ``precision``: mixed precision: the dtype policy, fp16 loss scaling, ``precision="auto"``.
- ``lr_schedules``: learning-rate scaling and warmup for large global batches.
"""
