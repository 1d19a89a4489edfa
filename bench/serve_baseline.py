"""The endpoint anyone would write first, the baseline of ``bench/serve.py``: FastAPI + onnxruntime,
one request -> one ``session.run``, pydantic request model, default uvicorn settings.

Usage: python bench/serve_baseline.py EXPORT_DIR PORT
"""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

session = ort.InferenceSession(f"{sys.argv[1]}/policy.onnx")
app = FastAPI()


class ActRequest(BaseModel):
    observations: list[list[float]]


@app.post("/v1/act")
def act(request: ActRequest) -> dict[str, list[int]]:
    actions = session.run(None, {"obs": np.asarray(request.observations, dtype=np.float32)})[0]
    return {"actions": actions.tolist()}


@app.get("/v1/health")
def health() -> dict[str, str]:
    return {"status": "ok"}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
