"""The embedded default: `python -m launcher` runs a whole Bernard on one machine.

It finds a Redis (or starts a throwaway one), then runs the worker and the API as child
processes, exactly as the Procfile does, and stops them all together. It never imports
`api` or `worker`: they run in their own processes, as in production.

`python -m launcher test-redis` makes sure a Redis answers for the test suite and prints
its URL (used by `./run test`).
"""
