"""Engines used by corral's own tests, demo and examples (importable on any worker)."""
