"""The baselines of ``bench/serve.py``: FastAPI + onnxruntime, one request -> one ``session.run``,
a pydantic request model.

- naive: what one writes first: a sync handler (run in Starlette's thread pool), onnxruntime's
  default thread pool, uvicorn's defaults (access log on).
- tuned: what a practitioner writes who has read the docs: an async handler (the model call is
  ~50 µs, cheaper than a thread hop), onnxruntime with one intra-op and one inter-op thread (its
  spinning pool otherwise takes the core the HTTP side needs), access log off, uvloop and httptools.

Usage: python bench/serve_baseline.py EXPORT_DIR PORT [--tuned]
"""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

TUNED = "--tuned" in sys.argv[3:]

options = ort.SessionOptions()
if TUNED:
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
session = ort.InferenceSession(f"{sys.argv[1]}/policy.onnx", options, providers=["CPUExecutionProvider"])
app = FastAPI()


class ActRequest(BaseModel):
    observations: list[list[float]]


def actions_for(request: ActRequest) -> dict[str, list[int]]:
    actions = session.run(None, {"obs": np.asarray(request.observations, dtype=np.float32)})[0]
    return {"actions": actions.tolist()}


if TUNED:

    @app.post("/v1/act")
    async def act_async(request: ActRequest) -> dict[str, list[int]]:
        return actions_for(request)

else:

    @app.post("/v1/act")
    def act(request: ActRequest) -> dict[str, list[int]]:
        return actions_for(request)


@app.get("/v1/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


if __name__ == "__main__":
    port = int(sys.argv[2])
    if TUNED:
        uvicorn.run(
            app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            access_log=False,
            loop="uvloop",
            http="httptools",
        )
    else:
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
