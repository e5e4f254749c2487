"""The API: speaks OpenAI-compatible HTTP, enqueues turns and relays their streams as SSE."""
