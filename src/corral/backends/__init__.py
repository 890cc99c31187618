"""Backends: each provides a Launcher and a thin Scheduler subclass."""
