"""The worker side: the processes that train, and the only code of tuner that imports TensorFlow.

``actor`` is the Ray actor the driver starts (TensorFlow is imported inside its methods, so the
driver can name the class); ``graph`` builds a model's graph, ``train`` runs it and stops at the
first non-finite value, ``forensics`` replays a divergence, ``seeding`` and ``telemetry`` serve the
loop, and ``checkmodel`` (``tuner check-model``) runs a user's model in its own process
(``adversaries``: its check of a loss that sums two adversarial terms).
"""
