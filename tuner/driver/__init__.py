"""The driver: one process per launch, never imports TensorFlow.

It runs the Optuna study (``search``), hands seed runs to the Ray workers (``executor``), records
every trial (``trialrecord``, ``studyrecord``), logs to MLflow (``tracking``), verifies the winner
on fresh seeds (``verify``, ``evidence``) and shows the study (``progress``, ``views``, ``plots``,
``report``, ``export``). ``tests/test_layout.py`` checks that nothing here imports TensorFlow, at
module level or through another tuner module.
"""
