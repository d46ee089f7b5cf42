"""durastream-server: a crash-safe, file-backed Durable Streams server.

Layers, from the wire down (each imports only the ones below it):

- ``http``           ASGI app: parses requests, builds responses, SSE and long-poll. Never touches a file.
- ``subscriptions``  Sections 6-7 of the protocol: webhook and pull-wake subscriptions.
- ``engine``         Protocol semantics: create/append/close/delete/fork, producers, TTL, JSON mode.
- ``storage``        Durable logs on disk: framed, checksummed records, segments, index, group commit.
"""

__version__ = "0.1.0"
