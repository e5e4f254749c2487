"""The Bernard integration's tests, run in the Home Assistant venv (./setup, ./run)."""
