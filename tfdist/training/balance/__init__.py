"""Balanced batches: uneven workers share each global batch by their measured speed.

Start at ``balancer`` (``BalanceOptions`` and the fit's ``Balancer``).

- ``balancer``: ``BalanceOptions``, its refusals, and the ``Balancer`` that re-decides between
calls.
- ``control``: the decision from what was measured, pure Python, the same on every worker.
"""
