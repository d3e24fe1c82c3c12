"""The stages of one exchange, each in a module named for it, in the order they run: ``previous`` (the committed
version, read once), ``placement`` and ``scope`` (which partitions can change), ``rows`` (the kernel's input
assembled once, decided as Arrow on the driver or in Spark), ``commit`` (every write). :mod:`rebalancer.pipeline`
and :mod:`rebalancer.what_if` compose them; ``meter`` measures them and ``paths`` holds where each runs."""
