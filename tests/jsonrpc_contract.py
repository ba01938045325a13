"""The JSON-RPC error codes and messages clients see, pinned here independently of the code."""

from chaingate.framing_constants import MAX_JSON_DEPTH

PARSE_ERROR = -32700
INVALID_REQUEST = -32600

MSG_INVALID_JSON = "parse error: invalid JSON"
MSG_TOO_DEEP = f"parse error: JSON nested deeper than {MAX_JSON_DEPTH} levels"
MSG_BAD_UTF8 = "parse error: body is not valid UTF-8"
MSG_EMPTY_BATCH = "invalid request: empty batch"
MSG_NOT_CALL = "invalid request: expected an object or an array of objects"
MSG_BATCH_ITEM = "invalid request: batch item is not an object"
MSG_BAD_ID = "invalid request: id must be a string, a number or null"
MSG_BAD_VERSION = 'invalid request: jsonrpc must be "2.0"'
MSG_NO_METHOD = "invalid request: method is missing"
MSG_BAD_METHOD = "invalid request: method must be a string"
MSG_BAD_PARAMS = "invalid request: params must be an array or an object"
