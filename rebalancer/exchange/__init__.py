"""The partition map exchange's decisions, without I/O: which versions a run commits and what each one decides.

* :mod:`~rebalancer.exchange.events` -- events -> the topology versions a run commits (pure Python);
* :mod:`~rebalancer.exchange.kernel` -- every per-partition decision of one exchange, for a batch of partitions
  (NumPy; SPEC section 4, docs/EXCHANGE.md);
* :mod:`~rebalancer.exchange.batches` -- the kernel over the Arrow batches one ``mapInArrow`` task receives;
* :mod:`~rebalancer.exchange.stamps` -- partition versions folded into group stamps;
* :mod:`~rebalancer.exchange.routing` -- the late assignment folded into client routing maps.

:mod:`rebalancer.pipeline` wires them to storage; nothing here imports it.
"""
