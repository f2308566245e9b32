"""Reading request bodies the way LibreTranslate clients send them: JSON, url-encoded form or multipart.

Bodies are size-capped before they are parsed (`BodyLimitMiddleware`), wrong content types are refused with 415,
and malformed JSON is a 400, all as typed errors that the API edge renders as `{"error": ...}`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import parse_qsl

from python_multipart.multipart import parse_options_header
from starlette.datastructures import MultiDict, UploadFile
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import InputTooLarge, InvalidInput

JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"
#: Form fields a request may carry (LibreTranslate's routes read a handful).
MAX_FIELDS = 200


#: A body must arrive at BODY_MIN_RATE bytes a second after the first BODY_GRACE_S seconds: a client that trickles
#: a byte now and then (slowloris) held a worker and its buffers for as long as it liked. A 10 MiB
#: upload at 16 KiB/s has 670 s.
BODY_GRACE_S = 30.0
BODY_MIN_RATE = 16 * 1024


class RequestTimeout(InvalidInput):
    """The request body came too slowly (BODY_GRACE_S, BODY_MIN_RATE)."""

    http_status = 408


class UnsupportedMediaType(InvalidInput):
    """The request body is not in a content type the route accepts."""

    http_status = 415


def content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


async def read_fields(request: Request, *, allow: tuple[str, ...] = (JSON, FORM, MULTIPART)) -> dict[str, Any]:
    """The request's fields as a dict: the query string's, then the body's over them, as LibreTranslate reads
    them (some of its clients POST everything in the query string). Fields repeated (q=a&q=b) become lists;
    files stay UploadFile.

    Call `await request.close()` afterwards (the routes do, in `finally`) so multipart temp files are removed.
    """
    fields = _multi(request.query_params)
    ctype = content_type(request)
    if ctype == "":
        body = await request.body()
        if not body:
            return fields
        # curl -d '{"q": ...}' without a header: accept a JSON object, refuse anything else.
        try:
            return {**fields, **_json_object(body)}
        except InvalidInput:
            raise UnsupportedMediaType(
                "Missing Content-Type: send application/json, application/x-www-form-urlencoded or "
                "multipart/form-data."
            ) from None
    if ctype not in allow:
        raise UnsupportedMediaType(f"Unsupported Content-Type {ctype[:60]!r}: send one of {', '.join(allow)}.")
    if ctype == JSON:
        return {**fields, **_json_object(await request.body())}
    if ctype == FORM:
        fields.update(_urlencoded(await request.body(), request.headers.get("content-type", "")))
        return fields
    fields.update(_multi(await request.form(max_files=1, max_fields=MAX_FIELDS)))
    return fields


def _urlencoded(body: bytes, header: str) -> dict[str, Any]:
    """A url-encoded form body. `curl -d q="¿Dónde está?"` sends the letters as raw UTF-8 bytes, not %-escaped;
    Starlette's form parser reads raw bytes as Latin-1 and made "Â¿DÃ³nde" of them (the model then answered "A
    thunder is threshold?"). Raw bytes are read in the header's charset, UTF-8 by default (what every terminal and
    the WHATWG URL standard use), with Latin-1 only for bytes that are not UTF-8; %-escapes are UTF-8 as before."""
    _, params = parse_options_header(header)
    charset = (params.get(b"charset") or b"utf-8").decode("latin-1")
    try:
        text = body.decode(charset)
    except (LookupError, UnicodeDecodeError):
        text = body.decode("latin-1")
    try:
        pairs = parse_qsl(text, keep_blank_values=True, max_num_fields=MAX_FIELDS)
    except ValueError:
        raise InvalidInput(f"Invalid request: more than {MAX_FIELDS} form fields.") from None
    return _multi(MultiDict(pairs))


def _multi(values: Any) -> dict[str, Any]:
    """A multi-dict (query string, form) as a dict; a key given more than once maps to the list of its values."""
    fields: dict[str, Any] = {}
    for key in values.keys():
        items = values.getlist(key)
        fields[key] = items[0] if len(items) == 1 else list(items)
    return fields


def _json_object(body: bytes) -> dict[str, Any]:
    if not body:
        raise InvalidInput("Invalid request: empty JSON body.")
    try:
        data = json.loads(body)
    except RecursionError:
        raise InvalidInput("Invalid JSON body: nested too deeply.") from None
    except ValueError as exc:
        # Whatever the decoder refuses is the client's: malformed JSON, bytes that are not UTF-8, and numbers
        # Python will not convert (a 5,000-digit integer passes the JSON grammar, then int() refuses it past
        # sys.get_int_max_str_digits: that was a 500, and the connection was dropped with it).
        raise InvalidInput(f"Invalid JSON body: {str(exc)[:120]}") from None
    if not isinstance(data, dict):
        raise InvalidInput("Invalid JSON body: expected an object such as {\"q\": ..., \"target\": ...}.")
    return data


def text_field(fields: dict[str, Any], name: str, *, required: bool = True, default: str | None = None) -> str | None:
    """A string field; LibreTranslate's wording for missing ones ("Invalid request: missing q parameter")."""
    value = fields.get(name)
    if value is None or value == "":
        if required:
            raise InvalidInput(f"Invalid request: missing {name} parameter")
        return default
    if isinstance(value, UploadFile) or not isinstance(value, str):
        raise InvalidInput(f"Invalid request: {name} must be a string")
    return value


def int_field(fields: dict[str, Any], name: str, *, default: int = 0) -> int:
    """A whole-number field, sent as a JSON number or as text (forms and query strings carry only text)."""
    value = fields.get(name)
    if value is None or value == "":
        return default
    if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
        raise InvalidInput(f"Invalid request: {name} must be a whole number")
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value.strip())
    raise InvalidInput(f"Invalid request: {name} must be a whole number")


def client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


class BodyLimitMiddleware:
    """Refuse request bodies over a cap before anything parses them (huge JSON, oversized uploads).

    `limits` maps a path prefix to its cap in bytes; the longest matching prefix wins; paths with no matching
    prefix are not capped here (the Gradio app enforces its own `max_file_size`).
    """

    def __init__(self, app: ASGIApp, limits: dict[str, int]) -> None:
        self.app = app
        self.limits = sorted(limits.items(), key=lambda kv: len(kv[0]), reverse=True)

    def _cap(self, path: str) -> int | None:
        for prefix, cap in self.limits:
            if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                return cap
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap = self._cap(scope.get("path", ""))
        if cap is None:
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            await _send_413(send, int(declared), cap)
            return
        seen = 0
        complete = False
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def counted_receive() -> Message:
            nonlocal seen, complete
            if complete:  # the body is in: what comes now is the disconnect a watcher waits for, however late
                return await receive()
            left = started + BODY_GRACE_S + seen / BODY_MIN_RATE - loop.time()
            try:
                message = await asyncio.wait_for(receive(), timeout=max(left, 0.001))
            except asyncio.TimeoutError:
                raise RequestTimeout(f"Request body too slow: {seen} bytes in {loop.time() - started:.0f} s "
                                     f"(at least {BODY_MIN_RATE // 1024} KiB/s after {BODY_GRACE_S:g} s).") from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if seen > cap:
                    # Surfaces in the route as a typed error (rendered 413 by the API's handler).
                    raise InputTooLarge(f"Request body too large: more than {cap} bytes.")
            return message

        await self.app(scope, counted_receive, send)


async def _send_413(send: Send, size: int, cap: int) -> None:
    body = json.dumps({"error": f"Request body too large: {size} bytes, at most {cap}."}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


async def wait_disconnected(request: Request) -> None:
    """Return once the client has gone away (its body already read: the next ASGI message is the disconnect)."""
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return


def source_field(fields: dict[str, Any]) -> str:
    """`source`, with "auto" in any case (and a missing source) meaning detect."""
    source = text_field(fields, "source", required=False, default="auto")
    return "auto" if source.strip().lower() == "auto" else source
