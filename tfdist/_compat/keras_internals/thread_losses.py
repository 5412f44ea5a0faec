"""Shim ``thread_losses``: each thread's ``add_loss`` terms in a list of its own.

Keras keeps a layer's ``add_loss`` terms (activity regularizers, ``self.add_loss`` in
``call``) in one list per layer (``Layer._losses``), cleared when a top-level call starts and
read by ``model.losses``. MirroredStrategy traces its replicas in threads that take turns at
each ``merge_call``; a merge_call inside the forward pass (a ``"sum"`` variable's
``assign_add``: a step counter) lets the next replica's call clear the lists, and then both
replicas' terms land in them. With a counter first, the second replica's loss held the
first's terms too: its gradients were right, but the logged loss was 0.42 too high at 2
replicas (issue 42; Keras's own ``fit`` under MirroredStrategy alike: 1.733 against 1.582 on
one device). With a counter after the ``add_loss`` layers, the clear dropped the first
replica's own terms, and their gradients (weights 8e-3 off after 3 SGD steps). Keras's call
context is already per thread (``global_state``); with the shim, so are the terms:
``add_loss``, ``_get_own_losses`` and ``_clear_losses`` use this thread's list outside a
``StatelessScope`` (inside one, Keras's scope collects them per thread already).
"""

from __future__ import annotations

import inspect
import threading
import weakref
from typing import Any

LAYER = "keras.src.layers.layer:Layer"

_LOCAL = threading.local()


def own_losses(layer: Any) -> list:
    """This thread's ``add_loss`` terms of ``layer`` since its last clear (the list itself)."""
    lists = getattr(_LOCAL, "lists", None)
    if lists is None:
        lists = _LOCAL.lists = weakref.WeakKeyDictionary()
    found = lists.get(layer)
    if found is None:
        found = lists[layer] = []
    return found


def make_add_loss(upstream: Any) -> Any:
    """``Layer.add_loss`` keeping the terms in this thread's list (`own_losses`)."""
    from keras import tree
    from keras.src import backend

    def add_loss(self, loss):
        losses = tree.flatten(loss)
        if backend.in_stateless_scope() or not all(backend.is_tensor(x) for x in losses):
            return upstream(self, loss)  # the scope's own collection, or Keras's error
        own_losses(self).extend(losses)
        return None

    add_loss.__doc__ = "Keras ``Layer.add_loss``, the terms kept per thread (tfdist shim)."
    return add_loss


def make_get_own_losses(upstream: Any) -> Any:
    """``Layer._get_own_losses`` reading this thread's list outside a ``StatelessScope``."""
    from keras.src import backend

    def _get_own_losses(self):
        return upstream(self) if backend.in_stateless_scope() else own_losses(self)[:]

    return _get_own_losses


def make_clear_losses(upstream: Any) -> Any:
    """``Layer._clear_losses`` clearing this thread's list too (sublayers through upstream's
    recursion, which calls this one)."""

    def _clear_losses(self):
        upstream(self)
        own_losses(self).clear()

    return _clear_losses


def keras_layer_losses_are_shared(fn: Any = None) -> bool:
    """True while Keras's ``add_loss`` (or ``fn``) keeps the terms in the layer's one list (the
    upstream one also once the shim is in force)."""
    from keras.src.layers.layer import Layer

    from tfdist._compat.shims import original

    upstream = fn or original("thread_losses") or Layer.add_loss
    return "self._losses.extend(" in inspect.getsource(upstream)
