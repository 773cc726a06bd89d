"""`make bench-peers` (entry bench/peers/run.py): the same workload on agents-stream and on Temporal, Restate, DBOS
and Quix Streams, each installed from the package registries into .data/peers/; not part of `make test`."""
