"""Bernard's benchmarks: the pipeline measured against an in-process baseline.

`python -m bench` starts its own Redis, the scripted upstream, the API, the worker and the
baseline server as real processes, runs every measurement and writes docs/benchmarks.md.
"""
