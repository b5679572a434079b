# main.py
import os

from fastapi import FastAPI

from forgezero_lifecycle import Runtime

app = FastAPI()
runtime = Runtime(
    control_token=os.environ["FORGEZERO_CONTROL_TOKEN"],
    revision=os.environ["FORGEZERO_REVISION"],  # the full 40-hex commit this code was built from
    # What `forgezero-lifecycle serve --not-ready-grace/--stream-grace` exports for the app:
    not_ready_grace=float(os.environ.get("FORGEZERO_NOT_READY_GRACE", "0")),
    stream_grace=float(os.environ.get("FORGEZERO_STREAM_GRACE", "5")),
)
runtime.install(app)  # in-flight middleware + the control plane under /.forgezero/runtime/


@app.get("/hello")
async def hello() -> dict[str, str]:
    return {"hello": "world"}
