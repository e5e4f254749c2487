"""`bernard`: the command line (cli/main.py). It talks to the API over HTTP only, as any
client would, and imports nothing of `api` or `worker`."""
