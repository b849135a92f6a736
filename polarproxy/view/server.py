"""The viewer's web server: a starlette app over `ViewData`, run by uvicorn on a loopback socket.

Read-only and local by construction: every route is GET (HEAD too); any other method gets 405 before a
route is looked at; a request whose Host header is not a loopback name gets 400 (so a web page elsewhere
cannot read the store through DNS rebinding); `bind` refuses an address that is not loopback.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, MutableMapping
from importlib import resources
from typing import Any

from polarproxy.loopback import host_name, is_loopback
from polarproxy.view.data import NotFound, ViewData

STATIC_FILES = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
READ_METHODS = ("GET", "HEAD")
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def static_text(name: str) -> str:
    """A file of the front end (index.html, app.js, app.css), from the package."""
    return resources.files("polarproxy.view").joinpath("static", name).read_text(encoding="utf-8")


class Guard:
    """ASGI middleware: 405 for every method but GET/HEAD, 400 for a Host that is not loopback, and
    security headers on every answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await self.app(scope, receive, send)
            return
        from starlette.responses import JSONResponse

        method = scope["method"]
        if method not in READ_METHODS:
            response = JSONResponse(
                {
                    "error": f"The viewer is read-only: {method} is not allowed.",
                    "hint": "Change the store with the polarproxy commands (reward, rm, prune).",
                },
                status_code=405,
                headers={"Allow": ", ".join(READ_METHODS)},
            )
            await response(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host", "")
        if host and not is_loopback(host_name(host)):
            response = JSONResponse(
                {
                    "error": f"Host {host!r} is not a loopback name; the viewer answers 127.0.0.1, ::1, localhost."
                },
                status_code=400,
            )
            await response(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [
                    (b"content-security-policy", CSP.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"cache-control", b"no-store"),
                ]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _json(data: Any, status: int = 200) -> Any:
    import orjson
    from starlette.responses import Response

    body = orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    return Response(body, status_code=status, media_type="application/json")


def create_app(data: ViewData) -> ASGIApp:
    """The ASGI app: the page at /, its assets at /static/, the payloads at /api/ (see data.py)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from polarproxy.store.errors import StoreError

    def answer(build: Callable[[], Any]) -> Any:
        try:
            return _json(build())
        except NotFound as e:
            return _json({"error": e.message, "hint": e.hint}, 404)
        except StoreError as e:
            return _json({"error": str(e), "hint": "Check the database; the page retries on reload."}, 503)
        except Exception as e:  # a bug, or a record this viewer cannot read: say which, keep serving
            import logging

            logging.getLogger("polarproxy.view").exception("request failed")
            return _json(
                {"error": f"{type(e).__name__}: {e}", "hint": "Reload to retry; see the server's log."}, 500
            )

    def index(request: Request) -> Any:
        return Response(static_text("index.html"), media_type="text/html; charset=utf-8")

    def static(request: Request) -> Any:
        name = request.path_params["name"]
        if name not in STATIC_FILES:
            return _json({"error": f"No file {name!r}."}, 404)
        return Response(static_text(name), media_type=STATIC_FILES[name])

    def info(request: Request) -> Any:
        return answer(data.info)

    def episodes(request: Request) -> Any:
        return answer(data.episodes)

    def episode(request: Request) -> Any:
        return answer(lambda: data.episode(request.path_params["id"]))

    def call(request: Request) -> Any:
        return answer(lambda: data.call(request.path_params["id"]))

    def trajectory(request: Request) -> Any:
        return answer(lambda: data.trajectory(request.path_params["id"], request.path_params["index"]))

    def tree(request: Request) -> Any:
        return answer(lambda: data.tree(request.path_params["id"]))

    def audit(request: Request) -> Any:
        return answer(lambda: data.audit(request.path_params["id"]))

    def groups(request: Request) -> Any:
        return answer(data.groups)

    def metrics(request: Request) -> Any:
        return answer(data.metrics)

    def unknown(request: Request) -> Any:
        return _json({"error": f"No page {request.url.path!r}.", "hint": "Open / for the episode list."}, 404)

    get = ["GET"]
    routes = [
        Route("/", index, methods=get),
        Route("/static/{name}", static, methods=get),
        Route("/api/info", info, methods=get),
        Route("/api/episodes", episodes, methods=get),
        Route("/api/episode/{id}", episode, methods=get),
        Route("/api/call/{id}", call, methods=get),
        Route("/api/trajectory/{id}/{index:int}", trajectory, methods=get),
        Route("/api/tree/{id}", tree, methods=get),
        Route("/api/audit/{id}", audit, methods=get),
        Route("/api/groups", groups, methods=get),
        Route("/api/metrics", metrics, methods=get),
        Route("/{rest:path}", unknown, methods=get),
    ]
    return Guard(Starlette(routes=routes))


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on loopback `host`:`port` (0: a free port). Raises ValueError for an address
    that is not loopback, OSError when the port is taken."""
    if not is_loopback(host):
        raise ValueError(
            f"--host {host!r} is not a loopback address. The viewer listens on loopback only: "
            "127.0.0.1 (the default), ::1 or localhost."
        )
    name = "127.0.0.1" if host.lower().rstrip(".") == "localhost" else host.strip("[]")
    family = socket.AF_INET6 if ":" in name else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((name, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def run(data: ViewData, sock: socket.socket) -> None:
    """Serve until interrupted (Ctrl-C)."""
    import uvicorn

    config = uvicorn.Config(create_app(data), log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
