"""The body of a worker actor: TensorFlow imported once, many seed runs, records streamed back.

``tuner.driver.executor`` turns :class:`TrialWorker` into a Ray actor, one per slot. Its ``run`` method is
a Ray streaming generator: the driver sees each record as soon as it is yielded, and
``ray.cancel`` on the generator sets the flag that ``run`` checks at every report.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from tuner import environ, hooks
from tuner.records import RunRecord, RunSpec, RunStatus

if TYPE_CHECKING:
    import numpy as np

    from tuner.models.base import Dataset, Model
    from tuner.records import Skip

# what ``import tensorflow`` imports eagerly: Keras 3's optimizers, or Keras 2's with TF_USE_LEGACY_KERAS
KERAS_EAGER_IMPORTS = ("keras.src.optimizers", "tf_keras.src.optimizers")
GRAPHS_KEPT = 4  # model configs whose built graphs a worker keeps (tuner.worker.train.Graphs)


def use_legacy_keras() -> None:
    """Select Keras 2 (the ``tf-keras`` package), which ``tf.compat.v1.layers`` are built on.

    With Keras 3, TensorFlow's default, ``tf.compat.v1.layers.dense`` raises "not available with
    Keras 3". TensorFlow reads ``TF_USE_LEGACY_KERAS`` once, when it is imported, so this must run
    before: every process that builds a model calls it (the workers through
    :func:`import_tensorflow`, and ``check-model``). A value set in the environment is kept.
    """
    environ.worker_tensorflow()


def import_tensorflow() -> None:
    """Import TensorFlow and the training loop, with Keras 2 selected but not loaded until a model uses it.

    ``import tensorflow`` imports Keras' optimizers eagerly (for SavedModel registrations), and
    with them all of Keras: about 1.5 s of a 4-5 s import on this project's machine. Workers train
    tf.compat.v1 graphs, so that import is skipped (TensorFlow's ``__init__`` ignores the
    ImportError); Keras still loads as usual when a model touches ``tf.compat.v1.layers`` or
    ``tf.keras``.
    """
    use_legacy_keras()
    # the TensorFlow import, paid once per actor, without Keras' eager imports (tuner.hooks.import_without)
    hooks.import_without("tuner.worker.train", KERAS_EAGER_IMPORTS, unless="tensorflow")
    import tuner.worker.train  # noqa: F401  (done above: names the import for readers and tests/test_layout.py)


class TrialWorker:
    """Runs seed runs one after another in a long-lived process."""

    def __init__(self, graph_reuse: bool = True) -> None:
        import_tensorflow()
        from tuner.worker.train import Graphs

        self._models: dict[str, Model] = {}
        self._graphs = Graphs(GRAPHS_KEPT if graph_reuse else 0)  # recent model configs' graphs, reseeded per run
        # (model, knobs, skip) -> (data, ids)
        self._data: dict[tuple[str, str, Skip], tuple[Dataset, np.ndarray | None]] = {}

    def ready(self) -> dict[str, object]:
        """Where this worker runs: node id, GPU ids and pid (answers once TF is imported)."""
        return self._where()

    def run(self, spec: RunSpec) -> Iterator[RunRecord]:
        """Train ``spec``; yield its progress records and its final record."""
        import ray

        from tuner.worker.train import train_run

        context = ray.get_runtime_context()
        try:
            model = self._model(spec.model)
            data, sample_ids = self._dataset(spec, model)
            started = time.perf_counter()
            for record in train_run(model, data, spec, context.is_canceled, self._where(), sample_ids, self._graphs):
                if record.final:
                    record = replace(record, info={**record.info, "run_seconds": time.perf_counter() - started})
                yield record
        except Exception as exc:  # a bug in the model or a bad config: FAIL, not retried
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            yield RunRecord(
                spec.trial, spec.seed, 0, RunStatus.FAILED, final=True, error=detail, phase=spec.phase,
                info={**self._where(), "traceback": traceback.format_exc(limit=8)},
            )

    def _model(self, spec: str) -> Model:
        from tuner.models import load_model

        if spec not in self._models:
            self._models[spec] = load_model(spec)
        return self._models[spec]

    def _dataset(self, spec: RunSpec, model: Model) -> tuple[Dataset, np.ndarray | None]:
        """The run's data less the samples the preflight flagged, and the kept samples' indices."""
        from tuner.preflight import without

        key = (spec.model, repr(sorted(spec.config.knobs.items())), spec.skip)
        if key not in self._data:
            self._data = {key: without(model.data(spec.config.knobs), spec.skip)}  # keep one: data can be large
        return self._data[key]

    @staticmethod
    def _where() -> dict[str, object]:
        import ray

        context = ray.get_runtime_context()
        return {
            "node_id": context.get_node_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cuda_visible_devices": environ.cuda_visible_devices(),
            "pid": os.getpid(),
        }
