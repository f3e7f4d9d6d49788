"""The worker's TensorFlow import: without Keras, which still loads when a model asks for it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

PROBE = """
import sys
from tuner.worker.actor import import_tensorflow

import_tensorflow()
print("keras after import:", "keras" in sys.modules, "sklearn" in sys.modules)
import tensorflow as tf

graph = tf.Graph()
with graph.as_default():
    x = tf.compat.v1.placeholder(tf.float32, [None, 3])
    y = tf.keras.layers.Dense(2)(x)
print("keras layer output:", tuple(y.shape.as_list()))
"""


@pytest.mark.tf
def test_import_tensorflow_skips_keras_until_a_model_uses_it() -> None:
    """In a fresh interpreter: the import leaves Keras out, and tf.keras still works afterwards."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "keras after import: False False" in result.stdout
    assert "keras layer output: (None, 2)" in result.stdout
