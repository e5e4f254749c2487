"""Fake external services for tests, served over real HTTP on loopback."""
