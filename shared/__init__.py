"""The contract between the API and the worker: settings, events, Redis keys, turn records."""
