"""JSON answers of the REST plane: msgspec with the API's own value types (addresses as
EIP-55 strings, uint256 as decimal strings)."""

from __future__ import annotations

import msgspec
from quart import Response

from chaingate.api.types import enc_hook

_encoder = msgspec.json.Encoder(enc_hook=enc_hook)


def encode(payload: object) -> bytes:
    return _encoder.encode(payload)


def json_response(payload: object, status: int = 200) -> Response:
    return Response(_encoder.encode(payload), status=status, mimetype="application/json")
