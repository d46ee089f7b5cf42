"""Deterministic request boundaries: by message count and bytes, never by time.

Why it matters (ordered mode): a retried task attempt that is fed the same rows in the same order must cut
them into byte-identical requests, so that every request it resends under the same ``(producer, epoch,
seq)`` is a true duplicate. A boundary that depended on timing (a linger timer, how many rows happened to
be buffered when a flush ran, the size of Spark's input batches) would differ between attempts, and the
server would answer the different bytes with a silent 204 (or, with payload digests, a 409).

The rule, applied row by row:

- a request is *full* once it holds ``max_messages`` rows, or once the next row would push its body past
  ``max_bytes`` (a single row larger than ``max_bytes`` travels alone);
- full requests are handed out as soon as they are full. Their content depends only on the rows up to and
  including the one that closed them, never on where the input ends;
- whatever is left when the input ends is the *remainder*: it depends on where the input ended, which a
  task cannot tell from a truncated input (Spark can end a failing task's input iterator cleanly). The
  modes never send it from the task on the strength of the task alone (see ``ordered.py`` and
  ``transactional.py``).

Body framing: for JSON streams a body is a JSON array of the rows' payloads (``[a,b,c]``; the server
turns each element into one message); for other content types it is the payloads concatenated.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from durastream_spark.protocol.body import RequestBody
from durastream_spark.sink.encoding import EncodedRows


@dataclass(frozen=True)
class Request:
    """One request body and how many rows (messages) it carries. The body is views of the encoded
    rows, never joined (``RequestBody``); ``bytes(body)`` where plain bytes are needed."""

    body: RequestBody
    rows: int


class RequestBatcher:
    """Cuts a sequence of encoded rows into full requests and one final remainder. Not thread-safe."""

    def __init__(self, max_messages: int, max_bytes: int, *, json_framing: bool) -> None:
        if max_messages < 1 or max_bytes < 1:
            raise ValueError("max_messages and max_bytes must be >= 1")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.json_framing = json_framing
        # For JSON the body is '[' + payloads (each with its trailing ',') with the last ',' turned into
        # ']': one byte more than the payloads. Other bodies are exactly the payloads.
        self._framing_bytes = 1 if json_framing else 0
        self._pieces: list[memoryview] = []
        self._count = 0
        self._payload_bytes = 0

    @property
    def pending_rows(self) -> int:
        return self._count

    def add(self, rows: EncodedRows) -> list[Request]:
        """Append ``rows`` in order; return the requests they completed (possibly none).

        Equivalent to taking the rows one at a time, but finds each boundary with a binary search over the
        (increasing) offsets, so the cost is per request, not per row.
        """
        full: list[Request] = []
        offsets = rows.offsets
        data = rows.data
        total = len(offsets) - 1
        limit = self.max_bytes - self._framing_bytes
        index = 0
        while index < total:
            room = self.max_messages - self._count
            # The most rows from ``index`` on that fit into the current request by count and by bytes.
            last = min(total, index + room)
            budget = limit - self._payload_bytes  # negative after a lone oversized row
            end = max(index, bisect_right(offsets, offsets[index] + budget, index, last + 1) - 1)
            if end == index:
                if self._count:  # the next row does not fit: the current request is full
                    full.append(self._emit())
                    continue
                end = index + 1  # a row larger than the limit travels alone
            self._pieces.append(data[offsets[index] : offsets[end]])
            self._count += end - index
            self._payload_bytes += offsets[end] - offsets[index]
            index = end
            if self._count == self.max_messages or index < total:
                # Full by count, or the next row (in this batch) would not fit.
                full.append(self._emit())
        return full

    @property
    def pending_body_bytes(self) -> int:
        """The size of the body ``remainder()`` would return (0 if there are no rows)."""
        return self._payload_bytes + self._framing_bytes if self._count else 0

    def remainder_bytes(self) -> bytes | None:
        """``bytes(remainder().body)``, joined at once. Ends the batcher.

        Why: a task routing to 10,000 streams commits most of them inline, as plain bytes; building a
        ``Request`` and its ``RequestBody`` first, only to join it, was a third of its ``finish``."""
        if not self._count:
            return None
        pieces = self._pieces
        self._pieces, self._count, self._payload_bytes = [], 0, 0
        if self.json_framing:
            return b"".join([b"[", *pieces[:-1], pieces[-1][:-1], b"]"])
        return b"".join(pieces)

    def remainder(self) -> Request | None:
        """The rows not yet in a full request, as one request (None if there are none). Ends the batcher."""
        if not self._count:
            return None
        return self._emit()

    # ---- internals ---------------------------------------------------------------------------------------

    def _emit(self) -> Request:
        pieces, count = self._pieces, self._count
        self._pieces, self._count, self._payload_bytes = [], 0, 0
        if self.json_framing:
            last = pieces[-1]
            return Request(RequestBody([b"[", *pieces[:-1], last[:-1], b"]"]), count)
        return Request(RequestBody(pieces), count)
