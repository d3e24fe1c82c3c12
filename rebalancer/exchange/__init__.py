"""The partition map exchange as pure DataFrame stages, plus the job that wires them to storage.

Stages (each a ``DataFrame -> DataFrame`` function without I/O, session settings or ``collect``), in the order
an exchange runs them (docs/EXCHANGE.md has the rules and every decision the SPEC leaves open):

1. :mod:`~rebalancer.exchange.fullmap` -- previous map on alive servers, overridden by newer reports;
2. :func:`~rebalancer.exchange.lost.apply_reset` -- ``RESET_LOST_PARTITIONS``: LOST copies become OWNING;
3. :mod:`~rebalancer.exchange.counters` -- owners behind the maximum update counter become MOVING;
4. :mod:`~rebalancer.exchange.lost` -- lost partitions, LOST marks, recreated empty copies;
5. :mod:`~rebalancer.exchange.late_affinity` -- the assignment that serves traffic, surplus copies RENTING;
6. :mod:`~rebalancer.exchange.demands` -- MOVING rows for ideal nodes without a copy, COPY demands.

Stage frames carry no version columns; the orchestrator adds ``topology_major``/``topology_minor``.
"""
