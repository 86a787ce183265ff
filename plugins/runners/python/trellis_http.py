"""HTTP(S) requests for step scripts, through the host's `wasi:http`.

A script reaches only the hosts its step lists in `agent_configs.allowed_hosts`
(loopback and private addresses only when the operator approved them with
`--allow-host`); any other request raises `RequestRefused` before a byte is
sent. Secrets are never in the script: `os.environ["SECRET_<NAME>"]` holds a
placeholder, and the host puts the real value in its place in the request's
headers, only for origins the operator approved for that secret.

    import os, trellis_http

    token = os.environ["SECRET_API_TOKEN"]            # a placeholder
    rows = trellis_http.get_json("https://api.example.com/v1/items",
                                 headers={"Authorization": f"Bearer {token}"})
    reply = trellis_http.post_json("https://api.example.com/v1/search", {"q": "x"})

Redirects are followed (up to `max_redirects`), each one checked by the host
like the first request: one to a host that is not allowed raises
`RequestRefused`.
"""

import json as _json
import urllib.parse

from componentize_py_types import Err
from wit_world.imports import outgoing_handler
from wit_world.imports import wasi_http_types as _t

__all__ = [
    "HttpError",
    "RequestRefused",
    "Response",
    "StatusError",
    "get",
    "get_json",
    "post",
    "post_json",
    "request",
]

_METHODS = {
    "GET": _t.Method_Get,
    "HEAD": _t.Method_Head,
    "POST": _t.Method_Post,
    "PUT": _t.Method_Put,
    "DELETE": _t.Method_Delete,
    "OPTIONS": _t.Method_Options,
    "PATCH": _t.Method_Patch,
}
_REDIRECTS = (301, 302, 303, 307, 308)
# Bytes written to the host per call (wasi:io allows 4096 per blocking write).
_CHUNK = 4096


class HttpError(Exception):
    """The request did not complete: refused, unreachable, timed out, too large."""


class RequestRefused(HttpError, PermissionError):
    """The host refused the request before sending it (host not allowed, a secret not
    approved for the origin, a private address without the operator's approval)."""


class StatusError(HttpError):
    """`raise_for_status()` on a response with a 4xx or 5xx status."""

    def __init__(self, response):
        super().__init__(f"{response.url} answered HTTP {response.status}")
        self.response = response


class Response:
    """A response read whole: `status`, `headers` (lower-case names), `content` (bytes),
    `url` (after redirects); `text`, `json()` and `raise_for_status()` as in `requests`."""

    def __init__(self, url, status, headers, content):
        self.url = url
        self.status = status
        self.status_code = status
        self.headers = headers
        self.content = content

    @property
    def ok(self):
        return self.status < 400

    @property
    def text(self):
        return self.content.decode("utf-8", errors="replace")

    def json(self):
        return _json.loads(self.content)

    def raise_for_status(self):
        if self.status >= 400:
            raise StatusError(self)
        return self


def get(url, headers=None, params=None, timeout=None):
    """GET `url` (with `params` added to its query)."""
    return request("GET", url, headers=headers, params=params, timeout=timeout)


def post(url, data=None, json=None, headers=None, timeout=None):
    """POST `data` (bytes or str) or `json` (encoded, with its content type) to `url`."""
    return request("POST", url, data=data, json=json, headers=headers, timeout=timeout)


def get_json(url, headers=None, params=None, timeout=None):
    """GET `url` and decode its JSON body; raises `StatusError` on a 4xx or 5xx status."""
    return get(url, headers=headers, params=params, timeout=timeout).raise_for_status().json()


def post_json(url, payload, headers=None, timeout=None):
    """POST `payload` as JSON and decode the JSON reply; raises `StatusError` on 4xx/5xx."""
    return post(url, json=payload, headers=headers, timeout=timeout).raise_for_status().json()


def request(method, url, headers=None, params=None, data=None, json=None, timeout=None,
            max_redirects=5):
    """Sends one request and reads the whole response. `timeout` in seconds bounds
    connecting and each wait for bytes (the host bounds them by the script's deadline)."""
    method = method.upper()
    if method not in _METHODS:
        raise ValueError(f"unsupported HTTP method {method!r}")
    headers = dict(headers or {})
    if json is not None:
        data = _json.dumps(json).encode("utf-8")
        if not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
    if isinstance(data, str):
        data = data.encode("utf-8")
    if params:
        split = urllib.parse.urlsplit(url)
        query = urllib.parse.urlencode(params, doseq=True)
        url = urllib.parse.urlunsplit(split._replace(
            query=f"{split.query}&{query}" if split.query else query))
    for _ in range(max_redirects + 1):
        response = _send(method, url, headers, data, timeout)
        location = response.headers.get("location")
        if response.status not in _REDIRECTS or not location:
            return response
        url = urllib.parse.urljoin(url, location)
        if response.status == 303 or (response.status in (301, 302) and method == "POST"):
            method, data = "GET", None
            headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
    raise HttpError(f"more than {max_redirects} redirects, the last to {url}")


def _send(method, url, headers, data, timeout):
    split = urllib.parse.urlsplit(url)
    if split.scheme not in ("http", "https") or not split.netloc:
        raise ValueError(f"{url!r} is not an absolute http:// or https:// URL")
    entries = [(str(k), str(v).encode("utf-8")) for k, v in headers.items()]
    if data is not None:
        entries.append(("content-length", str(len(data)).encode()))
    try:
        fields = _t.Fields.from_list(entries)
    except Err as err:
        raise HttpError(f"{url}: a header is not allowed: {err.value}") from None
    req = _t.OutgoingRequest(fields)
    req.set_method(_METHODS[method]())
    req.set_scheme(_t.Scheme_Https() if split.scheme == "https" else _t.Scheme_Http())
    req.set_authority(split.netloc)
    req.set_path_with_query((split.path or "/") + (f"?{split.query}" if split.query else ""))
    options = None
    if timeout is not None:
        options = _t.RequestOptions()
        nanos = int(timeout * 1_000_000_000)
        options.set_connect_timeout(nanos)
        options.set_first_byte_timeout(nanos)
        options.set_between_bytes_timeout(nanos)
    body = req.body()
    try:
        future = outgoing_handler.handle(req, options)
    except Err as err:
        raise _error(url, err.value) from None
    try:
        if data:
            stream = body.write()
            for start in range(0, len(data), _CHUNK):
                stream.blocking_write_and_flush(data[start:start + _CHUNK])
            stream.__exit__(None, None, None)
        _t.OutgoingBody.finish(body, None)
    except Err:
        # The host ended the request (refused, or the body is over its limit): the
        # response future says why.
        pass
    while True:
        result = future.get()
        if result is not None:
            break
        future.subscribe().block()
    if isinstance(result, Err):
        raise HttpError(f"{url}: the response was already taken")
    inner = result.value
    if isinstance(inner, Err):
        raise _error(url, inner.value)
    response = inner.value
    names = {}
    for name, value in response.headers().entries():
        names[name.lower()] = value.decode("utf-8", errors="replace")
    content = _read(url, response.consume())
    return Response(url, response.status(), names, content)


def _read(url, incoming):
    stream = incoming.stream()
    chunks = []
    while True:
        try:
            chunk = stream.blocking_read(65536)
        except Err as err:
            if isinstance(err.value, _streams_closed()):
                break
            stream.__exit__(None, None, None)
            trailers = _t.IncomingBody.finish(incoming)
            problem = _trailer_error(trailers)
            raise HttpError(f"{url}: reading the response failed: {problem}") from None
        chunks.append(chunk)
    stream.__exit__(None, None, None)
    return b"".join(chunks)


def _streams_closed():
    from wit_world.imports.streams import StreamError_Closed
    return StreamError_Closed


def _trailer_error(trailers):
    try:
        trailers.subscribe().block()
        result = trailers.get()
        if result is not None and isinstance(result.value, Err):
            return _describe(result.value.value)
    except Exception:  # noqa: BLE001 - the stream error is reported either way
        pass
    return "the connection failed or the body went over the host's limit"


def _describe(code):
    name = type(code).__name__.removeprefix("ErrorCode_")
    value = getattr(code, "value", None)
    return f"{name}: {value}" if value else name


def _error(url, code):
    if isinstance(code, _t.ErrorCode_InternalError) and code.value and "refused" in code.value:
        return RequestRefused(f"{url}: {code.value}")
    if isinstance(code, _t.ErrorCode_HttpRequestDenied):
        return RequestRefused(f"{url}: the host refused the request")
    return HttpError(f"{url}: {_describe(code)}")
