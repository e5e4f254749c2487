"""The embedded default: `python -m launcher` runs a whole Bernard on one machine.

It uses the Redis that REDIS_URL names (and stops with an error if that one does not
answer), or, with REDIS_URL unset, starts its own, persisted under `.bernard/redis/`.
Then it runs the worker and the API as child processes, exactly as the Procfile does,
and stops them all together, Redis last. It never imports `api` or `worker`: they run
in their own processes, as in production.
"""
