"""REST bodies and parameters a decoder could choke on, against a real ``chaingate serve`` on
SQLite and PostgreSQL (issue 25, items 1 and 8): nesting 1,000 or 100,000 deep, invalid or
overlong UTF-8, a key given twice, control characters, ``page=1e3`` — each a 400
``invalid_request`` in the spec's envelope naming what is wrong, never a 500, never an error
line or a traceback in the server's log.  A Hypothesis property drives random nesting and
bytes into every REST route a client writes to and asserts no answer is a 5xx.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from chaingate.api.build import build_api
from chaingate.api.routing import Route
from chaingate.devnet.anvil import AnvilProcess
from chaingate.framing_constants import MAX_JSON_DEPTH
from tests.conftest import pg_schema
from tests.serve_process import ServeProcess
from tests.test_framing_properties import JSON_SPLICES, mutated

BODY_ROUTES = [route for route in build_api().routes if route.body_type is not None]
# Every route a client sends a body to; those that take none must ignore it.
WRITE_ROUTES = [route for route in build_api().routes if route.method != "GET"]


class Server:
    """A running ``chaingate serve``, a key with every scope, its stderr (both logs)."""

    def __init__(self, serve: ServeProcess, key: str, log: Path) -> None:
        self.serve = serve
        self.log = log
        self.client = httpx.Client(base_url=serve.base, headers={"X-API-Key": key}, timeout=30)

    def send(self, method: str, path: str, body: bytes) -> httpx.Response:
        return self.client.request(
            method, path, content=body, headers={"Content-Type": "application/json"}
        )

    def json(self, method: str, path: str, body: Any = None, **params: Any) -> httpx.Response:
        return self.client.request(method, path, json=body, params=params or None)

    def assert_quiet_log(self) -> None:
        """No error line and no traceback in the application log since the start."""
        for line in self.log.read_text(errors="replace").splitlines():
            assert "Traceback" not in line, line
            if line.startswith("{") and '"level"' in line:
                assert json.loads(line)["level"] not in ("error", "critical"), line


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(
    request: pytest.FixtureRequest, anvil: AnvilProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp(f"rest-bodies-{request.param}")
    sqlite = contextlib.nullcontext(f"sqlite://{tmp}/store.db")
    with pg_schema() if request.param == "postgres" else sqlite as store_url:
        serve = ServeProcess(tmp, anvil.url, keys=True, follow=True, store_url=store_url)
        log = tmp / "stderr.log"
        with log.open("wb") as stderr, serve.start(stderr=stderr):
            key = serve.create_key(plan="enterprise")
            server = Server(serve, key, log)
            yield server
            server.client.close()


def target(route: Route) -> str:
    """The route's path with a made-up id for each parameter (refused bodies never get to
    look the id up)."""
    return re.sub(r"\{[a-z_]+\}", "x1", route.path)


def invalid(response: httpx.Response, *named: str) -> str:
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"code", "message", "status"}, error
    assert error["code"] == "invalid_request" and error["status"] == 400, error
    message: str = error["message"]
    for fragment in named:
        assert fragment in message, message
    return message


# --- what the issue found: depth and bytes ---------------------------------------------------

NESTED_1000 = b'{"name":' + b"[" * 1000 + b"]" * 1000 + b"}"
NESTED_100K = b'{"rules":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
NESTED_OBJECTS = b'{"rules":' + b'{"a":' * 40_000 + b"1" + b"}" * 40_000 + b"}"  # < 256 KiB
HOSTILE: list[tuple[bytes, str]] = [
    (NESTED_1000, f"nested deeper than {MAX_JSON_DEPTH} levels"),
    (NESTED_100K, f"nested deeper than {MAX_JSON_DEPTH} levels"),
    (NESTED_OBJECTS, f"nested deeper than {MAX_JSON_DEPTH} levels"),
    (b"[" * 200_000, f"nested deeper than {MAX_JSON_DEPTH} levels"),  # never closed
    (b'{"name":"\xff"}', "not valid UTF-8"),
    (b'{"name":"\xc0\xaf"}', "not valid UTF-8"),  # overlong "/"
    (b'{"name":"\xe0\x80\xaf"}', "not valid UTF-8"),  # overlong, three bytes
    (b'{"name":"\xed\xa0\x80"}', "not valid UTF-8"),  # a surrogate, encoded
    (b'{"name":"\xf4\x90\x80\x80"}', "not valid UTF-8"),  # above U+10FFFF
    (b'{"name":"\xe2\x82"}', "not valid UTF-8"),  # cut short
    (b'{"\xff":1}', "not valid UTF-8"),
    (b'{"name":"\\ud800"}', "malformed JSON body"),  # a lone surrogate, escaped
    (b'{"name":"a","name":"b"}', "the key 'name' is given twice"),
    (b'{"a":{"b":1,"c":[{"d":2,"d":3}]}}', "the key 'd' is given twice"),
    (b'{"name":"\\u003a\\u003A","name":"b"}', "the key 'name' is given twice"),
    (b'{"n\\u0061me":"a","name":"b"}', "the key 'name' is given twice"),
    (b'{"name":"a\x7fb"}', "'name': control characters"),  # DEL, as it is
    (b'{"name":"a\xc2\x85b"}', "'name': control characters"),  # NEL (C1), in UTF-8
    (b'{"name":"a\\u001b[31m"}', "'name': control characters"),
    (b'{"x":[{"\\u0000":1}]}', "'x[0].\\x00': control characters"),
]


def test_hostile_bodies_are_400_on_every_route_that_takes_a_body(server: Server) -> None:
    assert len(BODY_ROUTES) >= 8  # policies (3), sponsor, wallets, webhooks (3)
    for route in BODY_ROUTES:
        for body, message in HOSTILE:
            response = server.send(route.method, target(route), body)
            invalid(response, message)
    # A depth the framing accepts is decoded (and refused for what it is, not its depth).
    nested = b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1)
    fine = b'{"chain":"ethereum","rules":{},"name":' + nested + b"}"
    message = invalid(server.send("POST", "/v1/gas/policies", fine), "'name'")
    assert "nested" not in message
    server.assert_quiet_log()


def test_a_repeated_key_is_refused_even_with_colons_inside_strings(server: Server) -> None:
    body = b'{"name":"a:b:c","chain":"ethereum","rules":{},"name":"x"}'
    invalid(server.send("POST", "/v1/gas/policies", body), "the key 'name' is given twice")
    escaped = b'{"name":"\\"a\\":1","chain":"ethereum","rules":{"n\\u0061me":"z"}}'
    # Escaped quotes and escaped key spellings: one member each, nothing repeated.
    invalid(server.send("POST", "/v1/gas/policies", escaped), "rules.name")
    # An escaped backslash before "n" is no line break.
    backslash = {"name": "a\\nb", "chain": "ethereum", "rules": {}}
    assert server.json("POST", "/v1/gas/policies", backslash).json()["name"] == "a\\nb"
    ok = server.send(
        "POST", "/v1/gas/policies", b'{"name":"a:\\":b","chain":"ethereum","rules":{}}'
    )
    assert ok.status_code == 201, ok.text
    assert ok.json()["name"] == 'a:":b'


# --- item 8: integers, control characters ----------------------------------------------------


@pytest.mark.parametrize("value", ["1e3", "1E3", "1.0", "1000.0", "0x10", "+5", " 5", "5 "])
def test_page_and_limit_take_only_integers(server: Server, value: str) -> None:
    for path in ("/v1/webhooks", "/v1/gas/policies", "/v1/wallets"):
        invalid(server.json("GET", path, page=value), "'page'", "integer")
        invalid(server.json("GET", path, limit=value), "'limit'", "integer")
    assert server.json("GET", "/v1/gas/policies", page="3", limit="2").status_code == 200


@pytest.mark.parametrize(
    "name", ["a\x00b", "\x1b[31mred", "line\nbreak", "tab\there", "del\x7f", "c1\x85", "\u202eevil"]
)
def test_policy_names_with_control_characters_are_refused(server: Server, name: str) -> None:
    body = {"name": name, "chain": "ethereum", "rules": {}}
    invalid(server.json("POST", "/v1/gas/policies", body), "'name'")
    created = server.json("POST", "/v1/gas/policies", {**body, "name": "fine"})
    assert created.status_code == 201, created.text
    policy = created.json()["id"]
    invalid(server.json("PATCH", f"/v1/gas/policies/{policy}", {"name": name}), "'name'")
    assert server.json("GET", f"/v1/gas/policies/{policy}").json()["name"] == "fine"


def test_printable_names_in_any_script_are_kept(server: Server) -> None:
    name = "Équipe 東京 — gas 🚀"
    created = server.json(
        "POST", "/v1/gas/policies", {"name": name, "chain": "ethereum", "rules": {}}
    )
    assert created.status_code == 201, created.text
    assert created.json()["name"] == name


def test_control_characters_are_refused_in_every_text_field(server: Server) -> None:
    # A NUL is no PostgreSQL text: it must never reach the store.
    op = {
        "sender": "0x" + "11" * 20,
        "nonce": "0x0",
        "callData": "0x",
        "callGasLimit": "0x1",
        "verificationGasLimit": "0x1",
        "preVerificationGas": "0x1",
        "maxFeePerGas": "0x1",
        "maxPriorityFeePerGas": "0x1",
    }
    body = {"chain": "ethereum", "policy_id": "gp_\x00", "user_operation": op}
    invalid(server.json("POST", "/v1/gas/sponsor", body), "'policy_id'", "control characters")
    invalid(
        server.json("GET", "/v1/webhooks/wh_x/attempts", event_id="evt\x00"),
        "'event_id'",
        "control characters",
    )
    body = {"name": "p", "chain": "ethereum", "rules": {"allowed_methods": ["a\x1b"]}}
    invalid(server.json("POST", "/v1/gas/policies", body), "'rules.allowed_methods[0]'")
    server.assert_quiet_log()


# --- the property ----------------------------------------------------------------------------

FIELD_NAMES = sorted(
    {name for route in BODY_ROUTES for name in route.body_type.__struct_fields__}  # type: ignore[union-attr]
    | {"addresses", "allowed_contracts", "max_gas_usd", "sender", "callData"}
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**80), 2**80)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.sampled_from(["ethereum", "0x" + "ab" * 20, "1700000000", "0x", "gp_x1"])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(max_size=6), inner, max_size=5)
    ),
    max_leaves=20,
)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """A JSON object of plausible fields, then mangled: nested (shallow to very deep),
    re-keyed, cut, spliced with bytes that are not UTF-8 — or plain random bytes."""
    kind = draw(st.sampled_from(["object", "nested", "mutated", "bytes", "utf8"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    value = draw(st.dictionaries(st.sampled_from(FIELD_NAMES), json_values, max_size=6))
    text = json.dumps(value, ensure_ascii=draw(st.booleans())).encode()
    if kind == "nested":
        depth = draw(st.integers(1, 3000) | st.integers(MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH + 3))
        opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}"), (b'[{"k":', b"}]")]))
        field = draw(st.sampled_from(FIELD_NAMES)).encode()
        inner = opener * depth + text + closer * depth
        text = b'{"' + field + b'":' + inner + b"}"
    elif kind == "mutated":
        text = draw(mutated(text, [*JSON_SPLICES, b'"a":1,', b"\\u0000", b"\x1b"]))
    elif kind == "utf8":
        at = draw(st.integers(0, len(text)))
        bad = draw(st.sampled_from([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\x80"]))
        text = text[:at] + bad + text[at:]
    return text


@settings(
    max_examples=250,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(route=st.sampled_from(WRITE_ROUTES), body=bodies())
@example(route=BODY_ROUTES[0], body=NESTED_1000)
@example(route=BODY_ROUTES[0], body=b'{"name":"\xff"}')
def test_no_body_on_any_route_gets_a_5xx(server: Server, route: Route, body: bytes) -> None:
    response = server.send(route.method, target(route), body)
    assert response.status_code < 500, (response.status_code, response.text)
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["status"] == response.status_code, error


def test_the_property_left_no_error_in_the_log(server: Server) -> None:
    # Runs after the property on the same server (module order).
    server.assert_quiet_log()
