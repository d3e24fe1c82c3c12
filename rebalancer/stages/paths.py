"""Where an exchange's work runs: on the driver over Arrow up to these sizes, in Spark beyond them.

Each Spark job costs a fixed few hundred milliseconds whatever its size, so small work is cheaper on the driver;
large work is spread over the executors. The main limit is the warehouse's: ``Warehouse.driver_replicas``
(``storage.driver_replicas``), the largest cluster whose version the driver holds to generate, judge, decide and
write it. At XL (786,432 replicas, 2 cores) a failure's exchange takes 6.9 s as a process on the driver instead of
79 s in Spark; at XXL (2,801,664) 12.4-17.5 s instead of 173 s (docs/SCALING.md). The limits below are of work that
does not hold a version. Read at call time (``paths.NAME``): tests lower them to 0 to force the Spark paths.
"""

#: Which partitions a node's arrival touches is found on the driver up to this many partitions x servers ranked by
#: the client's affinity, beyond by a Spark job.
DRIVER_RANKINGS = 5_000_000
#: In Spark, single recomputed partitions are selected by SQL literals up to this many, beyond by a broadcast join
#: (:class:`rebalancer.stages.rows.SparkRows`).
KEYS_AS_LITERALS = 5_000
