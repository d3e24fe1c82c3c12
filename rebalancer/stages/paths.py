"""Where an exchange's work runs: on the driver over Arrow up to these sizes, in Spark beyond them.

Each Spark job costs a fixed few hundred milliseconds whatever its size, so small work is cheaper on the driver;
large work is spread over the executors. Read at call time (``paths.NAME``): tests lower them to 0 to force the
Spark paths.
"""

#: Exchanges of clusters with at most this many replicas (partitions x copies over the running groups) are decided
#: on the driver when the warehouse reads Arrow there (``Warehouse.reads_on_driver``): the same kernel, so the
#: same rows as in Spark, without its Spark jobs: at L (196,608 replicas, 2 cores) 0.8-1.7 s instead of 5-7.5 s
#: (docs/PERFORMANCE.md); at XL (786,432) a failure's exchange 6.9 s as a process instead of 79 s, at XXL
#: (2,801,664) 12.4-17.5 s instead of 173 s, the first exchange 29-74 s instead of 195 s and 4.5 GB at most
#: (docs/SCALING.md). Larger clusters keep the one pass in Spark, spread over the executors.
DRIVER_KERNEL_REPLICAS = 5_000_000
#: Which partitions a node's departure touches is found on the driver up to this many copies of the carried groups
#: (read as Arrow), beyond by a Spark job.
DRIVER_COPIES = 5_000_000
#: Which partitions a node's arrival touches is found on the driver up to this many partitions x servers ranked by
#: the client's affinity, beyond by a Spark job.
DRIVER_RANKINGS = 5_000_000
#: In Spark, single recomputed partitions are selected by SQL literals up to this many, beyond by a broadcast join
#: (:class:`rebalancer.stages.rows.SparkRows`).
KEYS_AS_LITERALS = 5_000
#: A generated cluster of up to this many replicas is written from the driver when the warehouse reads there: its
#: reports collected as Arrow by one Spark job, the rest built there (1 Spark job in all where the Spark path makes
#: 10 at S and 18 at XL). XL (786,432 replicas, delta-rs, 2 cores): 12.8 s as a process instead of 19.4 s.
DRIVER_GENERATE_REPLICAS = 5_000_000
