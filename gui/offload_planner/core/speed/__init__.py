"""Speed estimates: token generation and prompt processing of a plan on declared or known hardware.

:mod:`.hardware` holds the figures of each device (catalogue, declared, measured, default), with
their provenance; :mod:`.estimate` turns a plan into tokens per second; :mod:`.report` renders the
estimate for ``offload-planner plan`` and its ``--json``.  Pure Python: no Qt.
"""
