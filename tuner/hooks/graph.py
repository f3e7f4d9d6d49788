"""TensorFlow's private API (see :mod:`tuner.hooks`): a build that stops when its run is cancelled,
attributes set on an op of a kept graph, and TensorFlow imported without Keras' eager imports."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


CREATE_OP = "_create_op_internal"  # the tf.Graph method every Python op creation goes through
SET_ATTR = "_set_attr"  # the tf.Operation method that sets an attribute of an op already in a graph
CHECK_EVERY = 64  # ops between two calls of a build's should_stop (~10 ms of building)


class BuildStopped(BaseException):
    """The run was cancelled while its graph was being built.

    A BaseException, like asyncio's CancelledError: model code that catches ``Exception`` around
    a layer does not swallow it.
    """


def _never() -> bool:
    return False


_stoppable: list[type] = []  # the StoppableGraph class, made once TensorFlow is imported


def _stoppable_class(graph_class: type) -> type:
    """``StoppableGraph``: a ``graph_class`` whose op creation raises :class:`BuildStopped` once
    ``should_stop()`` turns true, asked every ``CHECK_EVERY`` ops."""
    if _stoppable and _stoppable[0].__mro__[1] is graph_class:
        return _stoppable[0]

    class StoppableGraph(graph_class):
        def __init__(self, should_stop: Callable[[], bool]) -> None:
            super().__init__()
            self._should_stop = should_stop
            self._made = 0

        def stop_checks(self) -> None:
            """Stop asking ``should_stop`` (the build is over; the graph may serve later runs)."""
            self._should_stop = _never

        def _create_op_internal(self, *args: Any, **kwargs: Any) -> Any:
            self._made += 1
            if self._made % CHECK_EVERY == 0 and self._should_stop():
                raise BuildStopped(f"cancelled after {self._made} ops of the graph were built")
            return super()._create_op_internal(*args, **kwargs)

    _stoppable[:] = [StoppableGraph]
    return StoppableGraph


def stoppable_graph(should_stop: Callable[[], bool]) -> Any:
    """A new ``tf.Graph`` whose op creation raises :class:`BuildStopped` once ``should_stop()`` turns true.

    Building a graph takes 1-3 s (gradients of an unrolled model are thousands of ops), longer
    than many runs train before a sibling seed diverges: without this, a cancelled run would hold
    its slot until its build ends. Fails open: a TensorFlow without ``Graph._create_op_internal``
    gets a plain ``tf.Graph`` (a build that does not stop early), said at debug level.
    """
    import tensorflow as tf

    if not callable(getattr(tf.Graph, CREATE_OP, None)):
        log.debug("tf.Graph has no %s: graph builds will not stop early when a run is cancelled", CREATE_OP)
        return tf.Graph()
    return _stoppable_class(tf.Graph)(should_stop)


def stop_checks(graph: object) -> None:
    """Stop asking a :func:`stoppable_graph`'s ``should_stop`` (its build is over); nothing for another graph."""
    stop = getattr(graph, "stop_checks", None)
    if stop is not None:
        stop()


def can_set_attrs() -> bool:
    """Whether :func:`set_int_attr` can set an op's attributes (TensorFlow's ``Operation._set_attr``)."""
    import tensorflow as tf

    if callable(getattr(tf.Operation, SET_ATTR, None)):
        return True
    log.debug("tf.Operation has no %s: a kept graph cannot be reseeded, each run builds its own", SET_ATTR)
    return False


def set_int_attr(op: Any, name: str, value: int) -> None:
    """Set the int attribute ``name`` of graph op ``op`` (check :func:`can_set_attrs` first)."""
    from tensorflow.core.framework import attr_value_pb2

    getattr(op, SET_ATTR)(name, attr_value_pb2.AttrValue(i=value))


def set_tensor_attr(op: Any, name: str, value: object) -> None:
    """Set the tensor attribute ``name`` of graph op ``op`` (a Const's ``value``) to array ``value``
    (check :func:`can_set_attrs` first)."""
    import tensorflow as tf
    from tensorflow.core.framework import attr_value_pb2

    getattr(op, SET_ATTR)(name, attr_value_pb2.AttrValue(tensor=tf.make_tensor_proto(value)))



def import_without(module: str, skipped: Sequence[str], unless: str = "tensorflow") -> None:
    """Import ``module`` with the modules ``skipped`` kept from loading: while it is imported, an
    import of one of them fails at once (``None`` in ``sys.modules``), and a package that imports
    them eagerly but tolerates their absence goes on without them. Nothing is skipped once
    ``unless`` was imported (its eager imports are done).

    For :func:`tuner.worker.actor.import_tensorflow`: ``import tensorflow`` imports Keras'
    optimizers (for SavedModel registrations) and ignores their ImportError (TensorFlow's
    ``__init__``); skipped, Keras loads only when a model uses it.

    Fails open: if ``module`` raises the ImportError of a skipped module (a TensorFlow that no
    longer tolerates it), it is imported again with nothing skipped, said at debug level.
    """
    blocked = [] if unless in sys.modules else [name for name in skipped if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]  # makes its import fail at once
    try:
        importlib.import_module(module)
        return
    except ImportError as exc:
        if exc.name not in blocked:
            raise
        log.debug("%s needs %s: imported with nothing skipped", module, exc.name)
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
    importlib.import_module(module)
