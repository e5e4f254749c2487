"""Harnesses: the stages of a turn, each an async generator of events."""
