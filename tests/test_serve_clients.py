"""Slow and malformed clients on a raw socket (issue 19, item 7): a read deadline on headers
and body (408), a body size bound (413), JSON error bodies for malformed input, counted in
``sloserve_client_errors_total{reason}``."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from serve_helpers import MODEL, LiveServer, live_server
from sloserve.serve.api import GatewaySettings

TIMEOUT = 0.5
BODY = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode()


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    settings = GatewaySettings(request_read_timeout_s=TIMEOUT, max_body_bytes=4096)
    with live_server(settings=settings) as srv:
        yield srv


def _head(length: int | str, ctype: str = "application/json", extra: str = "") -> bytes:
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {ctype}\r\n"
        f"Content-Length: {length}\r\n{extra}\r\n"
    ).encode()


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP response (status, headers, body) read off ``sock``."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError(f"closed before a response: {buf!r}")
        buf += data
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        data = sock.recv(65536)
        if not data:
            break
        rest += data
    return status, headers, rest[:length]


def _exchange(
    srv: LiveServer, *parts: bytes, pause: float = 0.0
) -> tuple[int, dict[str, str], bytes, float]:
    """Send ``parts`` (``pause`` seconds apart), read the response; (status, headers,
    body, seconds from the last part to the response)."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        for i, p in enumerate(parts):
            if i and pause:
                time.sleep(pause)
            sock.sendall(p)
        t = time.monotonic()
        status, headers, body = _read_response(sock)
        return status, headers, body, time.monotonic() - t


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, TimeoutError):
        return True


def _counter(srv: LiveServer, reason: str) -> float:
    text = httpx.get(f"{srv.url}/metrics", timeout=10).text
    m = re.search(rf'^sloserve_client_errors_total\{{reason="{reason}"\}} (\S+)$', text, re.M)
    assert m, text
    return float(m.group(1))


def _error(body: bytes, code: str) -> None:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code, err


def test_declared_body_that_never_arrives_gets_408(server: LiveServer) -> None:
    before = _counter(server, "read_timeout")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        t = time.monotonic()
        sock.sendall(_head(100))  # and never the 100 bytes
        status, headers, body = _read_response(sock)
        waited = time.monotonic() - t
        assert status == 408
        assert headers["content-type"] == "application/json"
        _error(body, "read_timeout")
        assert TIMEOUT * 0.8 < waited < TIMEOUT + 3
        assert _closed(sock)  # the connection is not kept for the missing bytes
    assert _counter(server, "read_timeout") == before + 1


@pytest.mark.parametrize(
    "parts",
    [
        [b""],  # connects, sends nothing
        [b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"],  # half the headers
        [b"POST /v1/comp", b"letions HTTP/1.1\r\n", b"Host: x\r\n"],  # trickled, never ends
    ],
)
def test_headers_that_never_end_get_408(server: LiveServer, parts: list[bytes]) -> None:
    before = _counter(server, "header_timeout")
    status, _h, body, _w = _exchange(server, *parts, pause=TIMEOUT / 4)
    assert status == 408
    _error(body, "request_timeout")
    assert _counter(server, "header_timeout") == before + 1


def test_a_trickled_body_is_bounded_as_a_whole(server: LiveServer) -> None:
    # every byte comes well within the deadline, the whole body does not
    pieces = [BODY[i : i + 4] for i in range(0, len(BODY), 4)]
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(_head(len(BODY)))
        t = time.monotonic()
        sock.settimeout(TIMEOUT / 5)
        for p in pieces:
            try:
                sock.sendall(p)
                if sock.recv(65536, socket.MSG_PEEK):
                    break  # answered
            except TimeoutError:
                pass
            except (BrokenPipeError, ConnectionResetError):
                break
        sock.settimeout(10)
        status, _h, _body = _read_response(sock)
        assert status == 408
        assert time.monotonic() - t < TIMEOUT + 3


def test_slow_but_in_time_requests_are_served(server: LiveServer) -> None:
    status, _h, body, _w = _exchange(server, _head(len(BODY)), BODY, pause=TIMEOUT / 3)
    assert status == 200, body
    # a kept-alive connection: the deadline starts again with the next request
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(_head(len(BODY)) + BODY)
        assert _read_response(sock)[0] == 200
        time.sleep(TIMEOUT * 1.5)  # idle between requests: not a slow request
        sock.sendall(_head(len(BODY)) + BODY)
        assert _read_response(sock)[0] == 200
        sock.sendall(_head(len(BODY)))  # then a request that stalls
        status, _h, body = _read_response(sock)
        assert status == 408


@pytest.mark.parametrize("chunked", [False, True])
def test_oversize_body_gets_413(server: LiveServer, chunked: bool) -> None:
    before = _counter(server, "body_too_large")
    if chunked:
        payload = b"x" * 5000
        head = (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        req = head + f"{len(payload):x}\r\n".encode() + payload + b"\r\n0\r\n\r\n"
        status, _h, body, _w = _exchange(server, req)
    else:
        status, _h, body, _w = _exchange(server, _head(10**9))  # refused before reading
    assert status == 413
    _error(body, "body_too_large")
    assert _counter(server, "body_too_large") == before + 1


@pytest.mark.parametrize("raw", [b"{not json", b'{"model": "x",', b"\xff\xfe", b"[1, 2"])
def test_invalid_json_gets_a_json_400(server: LiveServer, raw: bytes) -> None:
    before = _counter(server, "malformed_json")
    status, _h, body, _w = _exchange(server, _head(len(raw)) + raw)
    assert status == 400
    err = json.loads(body)["error"]
    assert "JSON" in err["message"]
    assert _counter(server, "malformed_json") == before + 1


@pytest.mark.parametrize(
    "ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", ""]
)
def test_a_body_not_sent_as_json_gets_415(server: LiveServer, ctype: str) -> None:
    before = _counter(server, "unsupported_media_type")
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
        + (f"Content-Type: {ctype}\r\n" if ctype else "")
        + f"Content-Length: {len(BODY)}\r\n\r\n"
    ).encode()
    status, _h, body, _w = _exchange(server, head + BODY)
    assert status == 415
    _error(body, "unsupported_media_type")
    assert _counter(server, "unsupported_media_type") == before + 1


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nBad Header Line\r\n\r\n",
    ],
)
def test_malformed_http_gets_a_json_400(server: LiveServer, raw: bytes) -> None:
    before = _counter(server, "malformed_http")
    status, headers, body, _w = _exchange(server, raw)
    assert status == 400
    assert headers["content-type"] == "application/json"
    _error(body, "malformed_http")
    assert _counter(server, "malformed_http") == before + 1


def test_the_server_still_serves_after_bad_clients(server: LiveServer) -> None:
    r = httpx.post(f"{server.base_url}/completions", content=BODY,
                   headers={"content-type": "application/json"}, timeout=10)  # fmt: skip
    assert r.status_code == 200, r.text


def test_read_settings_are_bounded() -> None:
    for bad in ({"request_read_timeout_s": 0}, {"request_read_timeout_s": float("inf")},
                {"max_body_bytes": 10}, {"max_body_bytes": True}, {"workers": 0}):  # fmt: skip
        with pytest.raises(ValueError):
            GatewaySettings(**bad)  # type: ignore[arg-type]
