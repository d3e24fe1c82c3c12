"""The twin: executes migration plans by writing the partition reports nodes would send."""
