"""tuner: find training configs of TF1 graph-mode models that do not diverge.

Importing this package is cheap: TensorFlow and Ray are imported only by the modules that need
them (``tuner.worker.train`` and the model builders in the workers; ``tuner.driver.executor`` in the driver).
"""

__version__ = "0.1.0"
