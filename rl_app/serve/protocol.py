"""The request and response format of ``POST /v1/act``, shared by the lightweight server and Ray Serve.

Request (JSON)::

    {"observations": [[0.01, 0.02, 0.03, 0.04]], "deterministic": true}
    {"observations": [[0.01, 0.02, 0.03, 0.04]], "deterministic": false, "seed": 7}   # sampled
    {"observations": {"base64": "<raw C-order bytes>", "dtype": "uint8", "shape": [1, 84, 84, 4]}}

Response: ``{"actions": [1], "policy": "ppo_cartpole/<stamp>", "iteration": 10}``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from rl_app.serve.policy import ObservationError, ObservationSpec, ServedPolicy

JSON = "application/json"
FIELDS = ("observations", "deterministic", "seed")
ENCODED_FIELDS = ("base64", "dtype", "shape")
ENCODED_DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "bool")
JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
NESTING_STEP = np.zeros(256, np.int32)
NESTING_STEP[list(b"[{")], NESTING_STEP[list(b"]}")] = 1, -1


@dataclass(frozen=True)
class ActRequest:
    """A checked ``/v1/act`` request."""

    observations: np.ndarray  # (N, *shape) float32
    deterministic: bool = True
    seed: int | None = None  # sampled actions only; None: fresh randomness


@dataclass
class RequestError(Exception):
    """A bad request: its HTTP status, the field at fault and one line saying what is wrong."""

    status: int
    field: str
    message: str
    reason: str  # a short label for /metrics

    def body(self) -> bytes:
        return json.dumps({"error": f"{self.field}: {self.message}", "field": self.field}).encode()


def unauthorized(authorization: str, token: str | None) -> RequestError | None:
    """The 401 for an ``Authorization`` header that is not ``Bearer <token>`` (compared in constant
    time); None when it is, or when no token is required."""
    if token is None or hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode()):
        return None
    return RequestError(401, "authorization", "missing or wrong bearer token", "unauthorized")


def check_content_type(content_type: str) -> None:
    """A RequestError (415) unless the ``Content-Type`` header says JSON."""
    media_type = content_type.split(";")[0].strip().lower()
    if media_type != JSON:
        raise RequestError(
            415, "content-type", f"expected {JSON}, got {media_type or 'none'}", "content_type"
        )


def health_body(policy: ServedPolicy) -> bytes:
    """The ``/v1/health`` answer: alive, and which policy and iteration it serves."""
    return json.dumps(
        {"status": "ok", "policy": policy.name, "iteration": policy.spec.get("iteration")}
    ).encode()


def _decode_encoded(encoded: dict[str, Any], max_rows: int) -> np.ndarray:
    unknown = sorted(set(encoded) - set(ENCODED_FIELDS))
    if unknown:
        raise RequestError(
            422,
            "observations",
            f"unknown field(s) {unknown}; allowed: {', '.join(ENCODED_FIELDS)}",
            "unknown_field",
        )
    dtype, shape, data = encoded.get("dtype"), encoded.get("shape"), encoded.get("base64")
    if dtype not in ENCODED_DTYPES:
        raise RequestError(
            422, "observations.dtype", f"{dtype!r} is not one of: {', '.join(ENCODED_DTYPES)}", "dtype"
        )
    if not (isinstance(shape, list) and shape and all(type(n) is int and n >= 0 for n in shape)):
        raise RequestError(422, "observations.shape", "expected a list of non-negative integers", "shape")
    if shape[0] > max_rows:
        raise RequestError(
            413, "observations", f"batch of {shape[0]} above the limit of {max_rows}", "batch_limit"
        )
    if not isinstance(data, str):
        raise RequestError(422, "observations.base64", "expected a base64 string", "encoding")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(422, "observations.base64", "not valid base64", "encoding") from None
    expected = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if len(raw) != expected:
        raise RequestError(
            422,
            "observations.base64",
            f"{len(raw)} bytes, but shape {shape} of {dtype} takes {expected}",
            "shape",
        )
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _nested_lists(rows: list[Any], max_rows: int) -> np.ndarray:
    if len(rows) > max_rows:
        raise RequestError(
            413, "observations", f"batch of {len(rows)} above the limit of {max_rows}", "batch_limit"
        )
    try:
        batch = np.asarray(rows)
    except ValueError:  # ragged rows
        raise RequestError(422, "observations", "rows of different lengths", "shape") from None
    if batch.dtype.kind not in "biuf":
        kind = "strings" if batch.dtype.kind == "U" else "mixed or nested values"
        raise RequestError(422, "observations", f"expected numbers, got {kind}", "dtype")
    return batch


def check_json_size(body: bytes, spec: ObservationSpec, max_rows: int) -> None:
    """A RequestError for a body nested deeper, or holding more values, than any request for
    ``spec`` can: found before parsing, which would otherwise recurse or allocate for it."""
    # The object, the batch, each observation's own nesting (or the encoded form's object and shape).
    most_depth = 2 + max(spec.nesting, 1 + (spec.structure is None))
    most_commas = max_rows * spec.values + len(FIELDS) + len(ENCODED_FIELDS)
    if body.count(b"[") + body.count(b"{") <= most_depth and body.count(b",") <= most_commas:
        return  # the common case, from two byte counts
    unquoted = JSON_STRING.sub(b'""', body)
    brackets = np.frombuffer(unquoted.translate(None, NOT_BRACKETS), np.uint8)
    depth = int(np.cumsum(NESTING_STEP[brackets]).max(initial=0))
    if depth > most_depth:
        message = f"nested {depth} deep; a request for observations of shape {spec.shape} nests {most_depth}"
        raise RequestError(400, "body", message, "too_deep")
    if (commas := unquoted.count(b",")) > most_commas:
        message = (
            f"{commas + 1} values or more; a request of {max_rows} observations holds at most {most_commas}"
        )
        raise RequestError(413, "body", message, "too_many_values")


def _parse_object(body: bytes) -> dict[str, Any]:
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(400, "body", f"malformed JSON ({exc})", "malformed_json") from None
    if not isinstance(request, dict):
        raise RequestError(422, "body", "expected a JSON object with 'observations'", "not_an_object")
    return request


def peek_request(body: bytes, specs: list[ObservationSpec], max_rows: int) -> dict[str, Any]:
    """The JSON object in ``body``, for a server of several policies to read its ``policy``: parsed
    only once its size fits a request for one of ``specs``."""
    errors = []
    for spec in specs:
        try:
            check_json_size(body, spec, max_rows)
            break
        except RequestError as error:
            errors.append(error)
    else:
        raise errors[0]
    return _parse_object(body)


def parse_act_request(
    body: bytes, spec: ObservationSpec, max_rows: int, sampling: str | None = None
) -> ActRequest:
    """The checked ``/v1/act`` request in ``body``, or a RequestError. ``sampling``: the served
    policy's distribution (None: it serves deterministic actions only)."""
    check_json_size(body, spec, max_rows)
    return act_request(_parse_object(body), spec, max_rows, sampling)


def act_request(
    request: dict[str, Any], spec: ObservationSpec, max_rows: int, sampling: str | None = None
) -> ActRequest:
    """The checked ``/v1/act`` request of a body's JSON object (see :func:`parse_act_request`)."""
    unknown = sorted(set(request) - set(FIELDS))
    if unknown:
        raise RequestError(422, unknown[0], f"unknown field; allowed: {', '.join(FIELDS)}", "unknown_field")
    deterministic, seed = request.get("deterministic", True), request.get("seed")
    if not isinstance(deterministic, bool):
        raise RequestError(
            422, "deterministic", f"expected true or false, got {deterministic!r}", "deterministic"
        )
    if not deterministic and sampling is None:
        message = "this policy serves deterministic actions only (its export has no action distribution)"
        raise RequestError(422, "deterministic", message, "deterministic")
    if seed is not None and (type(seed) is not int or not 0 <= seed < 2**63):
        raise RequestError(422, "seed", f"expected an integer in [0, 2**63), got {seed!r}", "seed")
    if seed is not None and deterministic:
        raise RequestError(
            422, "seed", "a seed only applies to sampled actions (deterministic: false)", "seed"
        )
    if "observations" not in request:
        raise RequestError(422, "observations", "missing", "missing_field")
    observations = request["observations"]
    if spec.structure is not None:
        if not isinstance(observations, list):
            raise RequestError(422, "observations", "expected a list of observations", "dtype")
        if len(observations) > max_rows:
            message = f"batch of {len(observations)} above the limit of {max_rows}"
            raise RequestError(413, "observations", message, "batch_limit")
        try:
            return ActRequest(spec.flatten_rows(observations), deterministic, seed)
        except ObservationError as exc:
            reason = "empty_batch" if not observations else "observation"
            raise RequestError(422, "observations", str(exc), reason) from None
    if isinstance(observations, dict):
        batch = _decode_encoded(observations, max_rows)
    elif isinstance(observations, list):
        batch = _nested_lists(observations, max_rows)
    else:
        message = "expected a list of observations or {base64, dtype, shape}"
        raise RequestError(422, "observations", message, "dtype")
    try:
        checked = spec.check(batch)
    except ObservationError as exc:
        reason = "empty_batch" if batch.size == 0 else "observation"
        raise RequestError(422, "observations", str(exc), reason) from None
    return ActRequest(checked, deterministic, seed)


def chosen_actions(
    request: ActRequest, actions: np.ndarray, dist_inputs: np.ndarray | None, policy: ServedPolicy
) -> np.ndarray:
    """The deterministic actions, or ones sampled with the request's seed."""
    if request.deterministic or dist_inputs is None:
        return actions
    return policy.sample(dist_inputs, np.random.default_rng(request.seed))


def act_response(actions: np.ndarray, policy: str, iteration: Any, deterministic: bool = True) -> bytes:
    """The JSON body answering an ``/v1/act`` request."""
    answer = {"actions": actions.tolist(), "policy": policy, "iteration": iteration}
    if not deterministic:
        answer["deterministic"] = False
    return json.dumps(answer).encode()
