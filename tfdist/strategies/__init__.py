"""Strategies by name, and the runners that drive them for the one training loop.

Start at ``base`` (the ``Runner`` protocol and the capabilities a runner may declare), then
``sync`` (one_device, mirrored, multi_worker) or ``ps/`` (parameter_server).

- ``factory``: ``make_strategy`` and ``runner_for``.
- ``registry``: each strategy's name -> the module that builds it, loaded on first use.
- ``one_device``, ``mirrored``, ``multi_worker``, ``parameter_server``: one file per strategy
  (``build(**options)``, ``RUNNER``, ``matches(strategy)``).
- ``base``: the runner protocol, ``graph_function`` and the loops over calls.
- ``sync``: ``SyncRunner``, the runner of the synchronous strategies.
- ``ps/``: ``PSRunner`` and what parameter servers alone need.
- ``balanced_split``: each worker's share of every global batch (``Trainer(balance=)``).
- ``step_clock``: where each update's time goes: input, compute, the wait for the exchange.
- ``stage_tasks``: pipeline stages on the tasks of a cluster.
"""
