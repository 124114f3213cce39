"""Speed estimates: token generation and prompt processing of a plan on declared or known hardware.

:mod:`.hardware` holds the figures of each device (catalogue, declared, measured, default), with
their provenance; :mod:`.estimate` turns a plan into tokens per second (a :mod:`.result`) from
what a token reads (:mod:`.reads`), the device rates (:mod:`.rates`), the graph splits
(:mod:`.splits`), -nkvo's round trips (:mod:`.nkvo`), token generation (:mod:`.tg`) and prompt
processing (:mod:`.pp`), naming its :mod:`.bottleneck` and :mod:`.assumptions`; :mod:`.report`
renders the estimate for ``offload-planner plan`` and its ``--json``.  Pure Python: no Qt.
"""
