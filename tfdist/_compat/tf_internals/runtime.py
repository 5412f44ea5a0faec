"""The TF runtime's and tf.distribute strategies' own state, which no public TF API exposes."""

from __future__ import annotations

from typing import Any


def tf_runtime_started() -> bool:
    """Whether TF's eager runtime has started in this process (devices fixed, ops may exist)."""
    from tensorflow.python.eager import context

    # The C context handle exists once TF initialised its devices; no public flag says so.
    return context.context()._context_handle is not None


def connected_to_cluster() -> bool:
    """Whether this process's eager runtime is connected to a cluster (``connect_to_cluster``)."""
    from tensorflow.python.eager import context

    # TF keeps the cluster it connected to only in the eager context.
    return context.get_server_def() is not None


def connected_cluster() -> dict[str, list[str]]:
    """The cluster this process is connected to, this process's own job included ({} if none)."""
    from tensorflow.python.eager import context

    server_def = context.get_server_def()
    if server_def is None:
        return {}
    return {job.name: [job.tasks[i] for i in sorted(job.tasks)] for job in server_def.cluster.job}


def is_default_strategy(strategy: Any) -> bool:
    """Whether ``strategy`` is TF's default (no-op) strategy, the one outside any ``scope()``."""
    # Its class is private and TF exports no predicate for it: match the class name.
    return type(strategy).__name__ == "_DefaultDistributionStrategy"


def ps_num_workers(strategy: Any) -> int:
    """The worker tasks of a ParameterServerStrategy's cluster."""
    # Public `strategy.cluster_resolver` is None for it (TF looks on `extended`, PS keeps it on
    # the strategy), so read the count its extended computed from the cluster spec.
    return int(strategy.extended._num_workers)


def coordination_service_enabled() -> bool:
    """Whether this process's eager runtime reaches TF's coordination service (MWMS clusters)."""
    from tensorflow.python.eager import context

    # The service's config lives only on the eager context; no public API reports it.
    if context.context()._context_handle is None:
        return False
    config = context.context().coordination_service
    return bool(config and config.service_type)


def key_value_set(key: str, value: str) -> None:
    """Sets ``key`` in the coordination service's key-value store, replacing any old value."""
    from tensorflow.python.eager import context

    # The store is public in C++ only; Python reaches it through the eager context.
    ctx = context.context()
    try:
        ctx.delete_config_key_value(key)
    except Exception:  # noqa: BLE001 - absent already: nothing to delete
        pass
    ctx.set_config_key_value(key, value)


def key_value_insert(key: str, value: str) -> bool:
    """Sets ``key`` in the coordination service's store only if absent; False if it was there."""
    from tensorflow.python.eager import context
    from tensorflow.python.framework import errors

    try:
        context.context().set_config_key_value(key, value)
    except errors.AlreadyExistsError:
        return False
    return True


def key_value_get(key: str, timeout_ms: int) -> str | None:
    """``key``'s value in the coordination service's store; None if absent after ``timeout_ms``."""
    from tensorflow.python.eager import context

    try:
        return context.context().get_config_key_value(key, timeout_in_ms=max(int(timeout_ms), 1))
    except Exception:  # noqa: BLE001 - DeadlineExceeded/NotFound: the key is not (yet) there
        return None


def op_determinism_enabled() -> bool:
    """Whether ``tf.config.experimental.enable_op_determinism()`` is on (no ``tf.timestamp``)."""
    from tensorflow.python.framework import config

    # TF exports the setter only; the getter lives in its private config module.
    return bool(config.is_op_determinism_enabled())
