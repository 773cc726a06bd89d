"""Benchmarks (`make bench`, entry bench/run.py): they print numbers; not part of `make test`."""
