"""The worker: runs turns as async generators of events and writes them to Redis Streams."""
