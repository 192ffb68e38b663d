"""API keys: who may use the server.

    python -m minicb serve --api-key KEY [--api-key OTHER ...]     # or MINICB_API_KEY=KEY[,OTHER]

With keys set, every request must carry `Authorization: Bearer KEY` for one of them (what every
OpenAI client sends from its `api_key`), on every route but GET /health: the completions, the
models list, /metrics, the routers' probes (/get_load, /server_info, ...), the OpenAPI document
and its pages, unknown paths, and any route added later. /health stays open so that a load
balancer or the cluster launcher can see the server is up without a key; it tells nothing but
"ok" and the queue's length.

How a refusal is made, and why:
  - before the app: the check is ASGI middleware, so a refused request never reaches routing,
    never has its body read or parsed, and never touches the engine (a client without the key
    cannot make the server do work); the connection is closed after the 401, so an unread body
    is not drained either;
  - 401 in OpenAI's error shape (code "invalid_api_key"), saying what to send, never what was
    sent;
  - constant time: the presented key is compared with every configured key by
    hmac.compare_digest, all of them every time, so the time taken tells neither which key
    nor how much of one matched;
  - a key in the URL is refused even with the right header: query strings end up in access
    logs, proxies' logs and browser history. The server's own access log prints no query
    string (hide_query_strings).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
from collections.abc import Mapping, Sequence
from urllib.parse import parse_qsl

ENV_VAR = "MINICB_API_KEY"
# the one route that needs no key: liveness, for load balancers and launchers
OPEN_PATHS = frozenset({"/health"})
# query parameters that carry a credential in some other server's convention
CREDENTIAL_PARAMS = frozenset({"api_key", "api-key", "apikey", "key", "access_token", "token",
                               "auth", "authorization", "bearer"})
SECURITY_SCHEME = {"bearerAuth": {"type": "http", "scheme": "bearer",
                                  "description": "an API key given to the server with --api-key "
                                                 "or MINICB_API_KEY"}}


def keys_from(given: Sequence[str] | None = None,
              environ: Mapping[str, str] = os.environ) -> list[str]:
    """The server's keys: each --api-key, then MINICB_API_KEY's (comma-separated), without
    blanks or repeats."""
    keys: list[str] = []
    for key in [*(given or []), *environ.get(ENV_VAR, "").split(",")]:
        key = key.strip()
        if key and key not in keys:
            keys.append(key)
    return keys


def client_key(environ: Mapping[str, str] = os.environ) -> str | None:
    """The key minicb's own clients send (the first of MINICB_API_KEY's), None without one."""
    keys = keys_from(None, environ)
    return keys[0] if keys else None


def bearer(key: str | None) -> dict[str, str]:
    """The header that carries `key` (none for None)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def is_loopback(host: str) -> bool:
    """Whether binding `host` reaches this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:           # a host name: it may resolve to anything
        return False


def exposure_warning(host: str, keys: Sequence[str]) -> str | None:
    """The one line to print when the server listens beyond this machine without a key."""
    if keys or is_loopback(host):
        return None
    return (f"warning: listening on {host} without an API key: anyone who can reach this port "
            f"can use the model, read /metrics and fill the queue; set --api-key or {ENV_VAR}.")


class APIKeyMiddleware:
    """ASGI middleware that answers 401 to any request (but OPEN_PATHS) without one of `keys`
    in its Authorization header, before the app sees it."""

    def __init__(self, app, keys: Sequence[str]):
        if not keys:
            raise ValueError("APIKeyMiddleware needs at least one key.")
        self.app = app
        self._keys = [key.encode() for key in keys]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})   # policy violation
        else:
            await _send_401(send, *refusal)

    def _matches(self, presented: bytes) -> bool:
        """Constant time over every key: no early exit, whichever key matches."""
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(presented, key)
        return matched

    def refusal(self, scope) -> tuple[str, str] | None:
        """(message, code) for a request that may not pass, None for one that may."""
        query = scope.get("query_string", b"").decode("latin-1")
        for name, value in parse_qsl(query, keep_blank_values=True):
            if name.lower() in CREDENTIAL_PARAMS or self._matches(value.encode()):
                return ("an API key may not travel in the URL (query strings are logged by "
                        "servers and proxies); send it in the header 'Authorization: Bearer "
                        "<key>' and revoke the one that was sent.", "api_key_in_url")
        values = [value for name, value in scope["headers"] if name == b"authorization"]
        if not values:
            return ("this server needs an API key: send the header 'Authorization: Bearer "
                    "<key>' (the openai client's api_key).", "invalid_api_key")
        # every Authorization header must carry a key (a router may add its own beside the
        # client's, as sglang-router does)
        valid = True
        for value in values:
            scheme, _, presented = value.partition(b" ")
            valid &= scheme.lower() == b"bearer" and self._matches(presented.strip())
        if not valid:
            return ("the API key is not valid for this server; send 'Authorization: Bearer "
                    "<key>' with a key the server was started with.", "invalid_api_key")
        return None


async def _send_401(send, message: str, code: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "param": None, "code": code}}).encode()
    await send({"type": "http.response.start", "status": 401, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", b'Bearer realm="minicb"'), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def secure_openapi(app, error_schema: dict) -> None:
    """Declare the bearer scheme in the app's OpenAPI document: every operation needs it and may
    answer 401 (OpenAI's error body), except those on OPEN_PATHS."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            document = build()
            document.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEME
            document["security"] = [{"bearerAuth": []}]
            content = {"application/json": {"schema": error_schema}}
            for path, operations in document.get("paths", {}).items():
                for operation in operations.values():
                    if path in OPEN_PATHS:
                        operation["security"] = []
                    else:
                        operation.setdefault("responses", {})["401"] = {
                            "description": "no API key, a wrong one, or one in the URL",
                            "content": content}
        return app.openapi_schema

    app.openapi = openapi


class _HideQueryStrings(logging.Filter):
    """uvicorn's access log line without the query string (it may hold a key)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) \
                and "?" in args[2]:
            record.args = (*args[:2], args[2].split("?", 1)[0] + "?<hidden>", *args[3:])
        return True


def hide_query_strings(logger_name: str = "uvicorn.access") -> None:
    """Install the filter on uvicorn's access logger (once)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, _HideQueryStrings) for f in logger.filters):
        logger.addFilter(_HideQueryStrings())
