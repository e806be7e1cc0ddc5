"""greeting: an HTTP function in Python with spin-sdk, served by Laurel from
spin.toml. It answers with the manifest's greeting and counts its visits in
the component's key-value store."""

from spin_sdk import http, key_value, variables
from spin_sdk.http import Request, Response


class HttpHandler(http.Handler):
    async def handle_request(self, request: Request) -> Response:
        if request.method not in ("GET", "POST"):
            return Response(405, {"allow": "GET, POST"}, b"")
        greeting = await variables.get("greeting")
        store = await key_value.open_default()
        seen = await store.get("visits")
        visits = int(seen.decode()) + 1 if seen else 1
        await store.set("visits", str(visits).encode())
        name = (request.body or b"").decode("utf-8", "replace").strip() or "you"
        text = f"{greeting}, {name}: visit {visits}\n"
        return Response(200, {"content-type": "text/plain; charset=utf-8"}, text.encode())
