"""The worker process (``python -m corral.worker``) and what it hosts."""
