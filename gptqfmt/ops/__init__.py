"""The bodies of the commands that read a checkpoint: inspect, verify, verify --against and
--reference; their results are what the reporters print."""
