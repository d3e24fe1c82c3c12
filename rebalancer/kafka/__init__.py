"""Apache Kafka as a live cluster: collect its state, execute plans on it (docs/KAFKA.md)."""
