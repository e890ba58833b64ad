"""The REST front of `edgec serve`: the Open Inference Protocol's HTTP/JSON endpoints and the binary tensor
data extension, on the standard library's ThreadingHTTPServer.

Why the standard library: a request's time is the devices' (milliseconds), not the parser's; a thread per
connection blocks on its request's Future, which is what the session offers; HTTP/1.1 keep-alive spares
tritonclient a connection per request; and a Pi serving it installs nothing more (aiohttp or
uvicorn+starlette add an event loop, ~10 MB of packages and a thread hop to reach the same Future).
"""

from __future__ import annotations

import email.utils
import json
import logging
import re
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..errors import InputError, one_line
from .front import Failure, Front
from .oip import BadRequest, encode_response, model_metadata, parse_infer, server_metadata

__all__ = ["HttpServer", "start_http"]

logger = logging.getLogger(__name__)

_MODEL = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?(/ready|/infer)?$")
_IDLE_S = 60.0  # a keep-alive connection silent this long is closed
_MAX_LINE, _MAX_HEADERS = 65536, 100  # what the standard library's parser allows
_REASONS = {s.value: s.phrase for s in HTTPStatus}


class _Headers(dict):
    """A request's headers by lowercased name (a repeated one's values joined by ", ", as RFC 9110 allows)."""

    def get(self, name: str, default=None):
        return super().get(name.lower(), default)


class HttpServer(ThreadingHTTPServer):
    daemon_threads = True  # an idle keep-alive connection must not hold the process at exit
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], front: Front, version: str, metrics=None):
        self.front, self.version, self.metrics = front, version, metrics
        super().__init__(address, _Handler)


def start_http(host: str, port: int, front: Front, version: str, metrics=None) -> HttpServer:
    return HttpServer((host, port), front, version, metrics)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "edgec"
    timeout = _IDLE_S
    # One send per answer (headers and body buffered, flushed after the handler) and no Nagle: two small sends
    # met the client's delayed ACK, 40 ms a request.
    wbufsize = 1 << 16
    disable_nagle_algorithm = True
    server: HttpServer

    def log_message(self, fmt: str, *args) -> None:  # the stdlib writes every request to stderr
        logger.debug("%s " + fmt, self.address_string(), *args)

    def parse_request(self) -> bool:
        """The request line and headers, as the standard library's parse_request reads them but without the
        email package, whose parser took a fifth of the front's Python time per request. HTTP/1.0 and 1.1."""
        self.command, self.request_version, self.close_connection = None, "HTTP/1.1", True
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        if len(words) != 3 or words[2] not in ("HTTP/1.0", "HTTP/1.1"):
            self._refuse(400, f"bad request line {self.requestline[:120]!r}: expected METHOD PATH HTTP/1.1 (or 1.0)")
            return False
        self.command, self.path, self.request_version = words
        if self.path.startswith("//"):
            self.path = "/" + self.path.lstrip("/")
        headers = _Headers()
        for _ in range(_MAX_HEADERS + 1):
            line = self.rfile.readline(_MAX_LINE + 1)
            if len(line) > _MAX_LINE:
                self._refuse(431, f"a header line longer than {_MAX_LINE} bytes")
                return False
            if line in (b"\r\n", b"\n", b""):
                break
            name, sep, value = str(line, "iso-8859-1").partition(":")
            if not sep or not name or name != name.strip():
                self._refuse(400, f"bad header line {line[:80]!r}: expected NAME: VALUE")
                return False
            key, value = name.lower(), value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        else:
            self._refuse(431, f"more than {_MAX_HEADERS} headers")
            return False
        self.headers = headers
        connection = headers.get("connection", "").lower()
        self.close_connection = connection == "close" or (self.request_version == "HTTP/1.0"
                                                          and connection != "keep-alive")
        if headers.get("expect", "").lower() == "100-continue" and self.request_version == "HTTP/1.1":
            return self.handle_expect_100()
        return True

    # -- routes ------------------------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        front, path = self.server.front, self.path.split("?", 1)[0]
        if not self._authorized():
            return
        if path == "/v2/health/live":
            return self._status(200)
        if path == "/v2/health/ready":
            return self._status(200 if front.ready else 503)
        if path == "/v2":
            return self._json(200, server_metadata(self.server.version))
        if path == "/metrics" and self.server.metrics is not None:
            body, content_type = self.server.metrics.exposition()
            return self._send(200, body, content_type)
        match = _MODEL.match(path)
        if match is None or match.group(3) == "/infer":
            return self._error(404 if match is None else 405, f"no GET {path[:120]}")
        try:
            model = front.model(match.group(1))
        except Failure as failure:
            return self._error(failure.http_status, str(failure))
        if match.group(3) == "/ready":
            return self._status(200 if front.accepting and model.session.ready else 503)
        return self._json(200, model_metadata(model.name, model.manifest))

    def do_POST(self) -> None:  # noqa: N802
        front, path = self.server.front, self.path.split("?", 1)[0]
        if not self._authorized():
            return
        match = _MODEL.match(path)
        if match is None or match.group(3) != "/infer":
            return self._refuse(404, f"no POST {path[:120]}")
        try:
            model = front.model(match.group(1))
        except Failure as failure:
            return self._refuse(failure.http_status, str(failure))
        body = self._body(model.limit, model.name)
        if body is None:
            return
        try:
            request = parse_infer(body, self._header_length(), model.manifest)
        except InputError as exc:
            failure = front.bad_request(exc)
            front.failed(model.name, failure.kind)
            return self._error(failure.http_status, str(failure))
        try:
            outputs = front.infer(model, request)
        except Failure as failure:
            return self._error(failure.http_status, str(failure))
        payload, head = encode_response(model.name, request, outputs)
        if head is None:
            return self._send(200, payload, "application/json")
        self._send(200, payload, "application/octet-stream", {"Inference-Header-Content-Length": str(head)})

    # -- reading -----------------------------------------------------------------------------------------
    def _body(self, limit: int, model: str) -> bytes | None:
        """The body, read only if its declared length is within `limit` (else 413 and the connection closed)."""
        if self.headers.get("Transfer-Encoding", "").lower() not in ("", "identity"):
            self.server.front.failed(model, "invalid")
            self._refuse(411, "a chunked body is not taken: send Content-Length")
            return None
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.server.front.failed(model, "invalid")
            self._refuse(411, "no Content-Length")
            return None
        if length < 0 or length > limit:
            self.server.front.failed(model, "too_large")
            self._refuse(413, f"a body of {length} bytes, more than the {limit} this model's inputs need")
            return None
        body = self.rfile.read(length)
        if len(body) != length:
            self.close_connection = True
            return None
        return body

    def _header_length(self) -> int | None:
        value = self.headers.get("Inference-Header-Content-Length")
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            raise BadRequest(f"Inference-Header-Content-Length {value[:40]!r}: not a number") from None

    def _authorized(self) -> bool:
        if self.server.front.authorized(self.headers.get("Authorization")):
            return True
        self._refuse(401, "a bearer token is required (Authorization: Bearer TOKEN)", {"WWW-Authenticate": "Bearer"})
        return False

    # -- writing -----------------------------------------------------------------------------------------
    def _status(self, code: int) -> None:
        self._send(code, b"", "text/plain")

    def _json(self, code: int, doc: dict) -> None:
        self._send(code, json.dumps(doc, separators=(",", ":")).encode(), "application/json")

    def _error(self, code: int, message: str, headers: dict | None = None) -> None:
        self._send(code, json.dumps({"error": one_line(message, 1000)}).encode(), "application/json", headers)

    def _refuse(self, code: int, message: str, headers: dict | None = None) -> None:
        """An error before the body was read: the connection closes (its unread body cannot be skipped)."""
        self.close_connection = True
        self._error(code, message, {"Connection": "close", **(headers or {})})

    def _send(self, code: int, body: bytes, content_type: str, headers: dict | None = None) -> None:
        """The status line, headers and body in one write (what send_response and send_header build, without
        their per-header calls)."""
        self.log_request(code)
        head = [f"HTTP/1.1 {code} {_REASONS.get(code, '')}", f"Server: {self.server_version}", f"Date: {_date()}",
                f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
        head += [f"{key}: {value}" for key, value in (headers or {}).items()]
        if (headers or {}).get("Connection", "").lower() == "close":
            self.close_connection = True
        try:
            self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1", "strict"))
            if body:
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client left: nothing to answer
            self.close_connection = True


_DATE: list = [0, ""]  # (the second, its HTTP date): one formatting a second, not one a request


def _date() -> str:
    now = int(time.time())
    if _DATE[0] != now:
        _DATE[:] = [now, email.utils.formatdate(now, usegmt=True)]
    return _DATE[1]
