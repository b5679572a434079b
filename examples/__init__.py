"""Runnable examples of forgezero-lifecycle (``uvicorn examples.<name>.app:app``)."""
