"""A request body kept in the pieces it already lives in, and sent without joining them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


class RequestBody:
    """The bytes of one request body, as a sequence of buffers.

    Why: the sink's request bodies are slices of the Arrow buffer its encoder wrote, plus a JSON array's
    brackets. Joining them into one ``bytes`` copied every byte the sink sends once more, about a tenth
    of the Python workers' CPU. ``requests`` sends an iterable whose length is known as it is:
    ``Content-Length`` from ``len()``, then each piece with ``sendall``; a retry iterates again.
    Pickled (the ordered mode's last request travels to the driver in the commit message), it becomes
    plain ``bytes``. The pieces must not change while the body is in use (Arrow buffers never do).
    """

    __slots__ = ("_pieces", "_size")

    def __init__(self, pieces: Iterable[bytes | bytearray | memoryview]) -> None:
        kept = tuple(piece for piece in pieces if len(piece))
        self._pieces = kept
        self._size = sum(len(piece) for piece in kept)

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[bytes | bytearray | memoryview]:
        return iter(self._pieces)

    def __bytes__(self) -> bytes:
        return b"".join(self._pieces)

    def __reduce__(self) -> tuple[Any, ...]:
        return (bytes, (bytes(self),))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (RequestBody, bytes, bytearray, memoryview)):
            return bytes(self) == bytes(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # compares by content, like bytearray

    def __repr__(self) -> str:
        return f"RequestBody({len(self._pieces)} pieces, {self._size} bytes)"


def wire_body(body: bytes | bytearray | memoryview | RequestBody) -> bytes | RequestBody:
    """What the client sends: a ``RequestBody`` as it is, any other buffer as ``bytes``."""
    return body if isinstance(body, RequestBody) else bytes(body)
