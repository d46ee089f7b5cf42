"""The HTTP layer: a thin ASGI app (no framework) that parses requests into engine calls and renders results.

Modules, each with one job:

- ``app``            lifespan, routing, error mapping by exception type, one DEBUG log line per request
- ``paths``          URL routing and the request-path -> stream-path mapping (``a/b`` is not ``a%2Fb``)
- ``parse``          header and query syntax -> engine requests (``BadRequest`` on malformed input)
- ``body``           bounded request-body reading (413 without buffering past the limit)
- ``handlers``       PUT / POST / GET (catch-up, long-poll, SSE) / HEAD / DELETE on streams
- ``live``           parking long-poll and SSE readers in ``engine.wait``; release on hang-up or shutdown
- ``sse``            Server-Sent Events framing
- ``responses``      sending responses with the security and CORS headers every response carries
- ``cors``, ``cursor``, ``etag``   section 12.7 / 10.1 details
- ``auth``           bearer-token checks per request (``--auth-token``; rules in its docstring)
- ``guard``          the uvicorn protocol with header-size, slow-sender, framing and ``Host`` checks
- ``hosts``          which ``Host`` values are answered (``--allowed-host``, DNS rebinding)
- ``subscriptions``  hands ``/v1/stream/__ds/...`` to the subscription service as plain values

The HTTP layer never touches a file: the backend (engine, subscriptions) is opened by ``server.py``.
"""
