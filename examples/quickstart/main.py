# main.py
import os

from fastapi import FastAPI

from forgezero_lifecycle import Runtime

app = FastAPI()
runtime = Runtime(
    control_token=os.environ["FORGEZERO_CONTROL_TOKEN"],
    revision=os.environ["FORGEZERO_REVISION"],  # the 40-hex commit of this code
    # What `forgezero-lifecycle serve --not-ready-grace/--stream-grace` exports:
    not_ready_grace=float(os.environ.get("FORGEZERO_NOT_READY_GRACE", "0")),
    stream_grace=float(os.environ.get("FORGEZERO_STREAM_GRACE", "5")),
)
runtime.install(app)  # in-flight middleware, control plane at /.forgezero/runtime/


@app.get("/hello")
async def hello() -> dict[str, str]:
    return {"hello": "world"}
