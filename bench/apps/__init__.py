"""Small ASGI apps the benchmark servers load (``uvicorn --factory bench.apps.<module>:<name>``)."""
