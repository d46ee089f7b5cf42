"""The Durable Streams protocol client used by the source and the sink.

Modules, each with one job:

- ``client``: ``StreamClient``, one method per protocol operation (HEAD, PUT, POST append/close/stage/commit/
  abort, GET catch-up/bounded/frames, limit lookups, listing);
- ``retry``: what may be repeated, and how long to wait (``RetryPolicy``, ``Retrier``);
- ``session``: one keep-alive ``requests.Session`` per worker process and server, fork-safe;
- ``auth``: the user's headers and the bearer token from ``tokenFile``;
- ``extensions``: which durastream extensions the server advertises;
- ``models``: the frozen results (``StreamMeta``, ``AppendResult``, ``ReadChunk``, ...);
- ``frames``: ``format=frames`` bodies to Arrow arrays without copying;
- ``jsonarray``: the fallback for servers without frames (split a JSON array body into messages).

Import from the submodules (``from durastream_spark.protocol.client import StreamClient``); this package
re-exports nothing, so that ``options`` can import ``retry`` without pulling in the client.
"""
