"""Idempotent request senders: a sequenced producer, and a set of independent requests.

``PipelinedProducer`` sends the requests of one ``(producer id, epoch)`` under seqs ``0, 1, 2, ...`` on pool
threads, while the task's main thread goes on reading and encoding input (that is the pipelining: the
encoder never waits for the network, up to ``maxInFlight`` requests). What it guarantees, because the
sink's exactly-once argument rests on it (hazards 1-3, 5, 6 and 36):

- **Every request is sent with one fixed seq and the same bytes on every try.** Seqs are assigned when a
  request is submitted, in submission order, and never reassigned; retries (in ``StreamClient``) resend the
  identical body. A 204 duplicate is a delivery.
- **No error is swallowed.** The first failure is recorded; ``submit`` raises it at the next call (so the
  writer stops consuming input), later requests are not sent, and ``drain`` raises it. A caller can never
  get a clean ``drain`` while any request failed.
- **Gaps are waited out, not skipped.** Requests sent concurrently on separate connections (a ``window``
  above 1, or two attempts of one task sharing the producer) can reach the server out of order, and an
  overtaking seq gets ``409`` (gap). The producer then waits until every lower seq of its own has completed
  and sends it again. If a lower seq failed, it is abandoned (the lower failure is the one reported). A gap
  that persists after every lower seq succeeded is a server-side inconsistency and fails the producer.
- **The first seq goes alone.** A server accepts a new epoch only at seq 0 (a later seq arriving first is a
  400), so nothing else is sent before the first request has been answered.
- **Epochs are never claimed.** A ``403`` (stale epoch) propagates as the failure: a newer batch owns the
  producer and this attempt must stop. Retrying under a bumped epoch would let two attempts fence each other
  in turn and both keep writing (hazard 36).

``IndependentRequests`` runs requests that need no order among themselves (each with its own producer
tuple: the transactional mode's stage requests, one handle each) fully concurrently, with the same
failure rules.

Threads come from a ``RequestPool`` shared by all senders of one task, whose size is the task's
``maxInFlight``: it bounds concurrency and the memory held by bodies not yet acknowledged (``submit``
blocks while the pool is full).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Generic, TypeVar

from durastream_spark.errors import SequenceGapError
from durastream_spark.protocol.body import RequestBody
from durastream_spark.sink.errors import ProducerStateLost

log = logging.getLogger(__name__)

R = TypeVar("R")

MAX_GAP_RETRIES = (
    3  # after every lower seq succeeded; more than this is a server-side inconsistency
)


class RequestPool:
    """Worker threads plus a bound on requests in flight, shared by the producers of one task."""

    def __init__(self, max_in_flight: int) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self._executor = ThreadPoolExecutor(
            max_workers=max_in_flight, thread_name_prefix="durastream-sink"
        )
        self._slots = threading.Semaphore(max_in_flight)

    def submit(self, work: Callable[[], R]) -> Future[R]:
        """Run ``work`` on a pool thread once a slot is free (blocks the caller until then)."""
        self._slots.acquire()

        def run() -> R:
            try:
                return work()
            finally:
                self._slots.release()

        try:
            return self._executor.submit(run)
        except BaseException:
            self._slots.release()
            raise

    def shutdown(self) -> None:
        """Wait for requests in flight; requests not yet started are cancelled."""
        self._executor.shutdown(wait=True, cancel_futures=True)


class _Abandoned(Exception):
    """A request not sent (or not resent) because a lower seq of the same producer failed."""


class PipelinedProducer(Generic[R]):
    """Sends request bodies under consecutive seqs of one producer tuple; see the module docstring.

    ``send(seq, body)`` performs one protocol request (with the client's own retries) and returns its
    result or raises a typed error. ``label`` names the producer in errors and logs. ``window`` is how
    many of this producer's requests may be on the wire at once: requests sent concurrently on separate
    connections can reach the server out of order, and every overtaking request is answered with a gap
    and has to be sent again, so with large bodies a window of 1 (the default: the encoding thread still
    runs ahead, and other producers of the task send in parallel) is usually the fastest.
    """

    def __init__(
        self,
        send: Callable[[int, bytes], R],
        pool: RequestPool,
        *,
        label: str,
        first_seq: int = 0,
        window: int = 1,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._send = send
        self._pool = pool
        self.label = label
        self.first_seq = first_seq
        self.window = window
        self._next_seq = first_seq
        self._futures: list[Future[R]] = []
        self._lock = threading.Condition()
        self._watermark = first_seq  # every seq below it has completed
        self._completed_above: set[int] = set()
        self._first_unsuccessful: int | None = None  # lowest seq that failed or was abandoned
        self._failure: tuple[int, BaseException] | None = None

    @property
    def next_seq(self) -> int:
        """The seq the next submitted request gets (= first seq + requests submitted)."""
        return self._next_seq

    @property
    def submitted(self) -> int:
        return self._next_seq - self.first_seq

    def submit(self, body: bytes | RequestBody) -> int:
        """Queue ``body`` under the next seq and return that seq. Raises an earlier failure instead."""
        self.raise_failure()
        seq = self._next_seq
        self._next_seq += 1
        self._futures.append(self._pool.submit(lambda: self._run(seq, body)))
        return seq

    def drain(self) -> list[R]:
        """Wait for every submitted request; their results in seq order, or the first failure raised."""
        wait(self._futures)
        self.raise_failure()  # the lowest-seq failure recorded by _run
        return [future.result() for future in self._futures]

    def raise_failure(self) -> None:
        with self._lock:
            failure = self._failure
        if failure is not None:
            raise failure[1]

    # ---- one request -------------------------------------------------------------------------------------

    def _run(self, seq: int, body: bytes | RequestBody) -> R:
        try:
            # The first seq goes alone; after it, at most ``window`` of this producer's seqs are on the wire.
            if seq != self.first_seq:
                self._wait_for_lower(max(self.first_seq + 1, seq - self.window + 1))
            gaps = 0
            while True:
                try:
                    result = self._send(seq, body)
                except SequenceGapError as gap:
                    self._wait_for_lower(seq)
                    gaps += 1
                    if gaps > MAX_GAP_RETRIES:
                        raise ProducerStateLost(
                            f"{gap} Every earlier request of {self.label} was answered, yet the "
                            f"server still reports a gap before seq {seq}: it lost producer state."
                        ) from gap
                    log.debug("%s: seq %d overtook an earlier seq; resending", self.label, seq)
                    continue
                self._finish(seq, ok=True)
                return result
        except _Abandoned:
            self._finish(seq, ok=False)
            raise
        except BaseException as error:
            self._finish(seq, ok=False, error=error)
            raise

    def _wait_for_lower(self, limit: int) -> None:
        """Block until every seq below ``limit`` has completed; abandon if any of them did not succeed."""
        with self._lock:
            self._lock.wait_for(lambda: self._watermark >= limit)
            if self._first_unsuccessful is not None and self._first_unsuccessful < limit:
                raise _Abandoned()

    def _finish(self, seq: int, *, ok: bool, error: BaseException | None = None) -> None:
        with self._lock:
            self._completed_above.add(seq)
            while self._watermark in self._completed_above:
                self._completed_above.remove(self._watermark)
                self._watermark += 1
            if not ok and (self._first_unsuccessful is None or seq < self._first_unsuccessful):
                self._first_unsuccessful = seq
            if error is not None and (self._failure is None or seq < self._failure[0]):
                self._failure = (seq, error)
            self._lock.notify_all()


class IndependentRequests(Generic[R]):
    """Requests that need no sequence among themselves (each carries its own producer tuple, so each is
    retried and deduplicated on its own), run concurrently on the pool.

    Same failure rules as ``PipelinedProducer``: the first failure is raised by the next ``submit`` (so the
    writer stops) and by ``drain``; nothing is swallowed.
    """

    def __init__(self, pool: RequestPool) -> None:
        self._pool = pool
        self._futures: list[Future[R]] = []
        self._lock = threading.Lock()
        self._failure: tuple[int, BaseException] | None = None

    def submit(self, work: Callable[[], R]) -> None:
        self.raise_failure()
        index = len(self._futures)

        def run() -> R:
            try:
                return work()
            except BaseException as error:
                with self._lock:
                    if self._failure is None or index < self._failure[0]:
                        self._failure = (index, error)
                raise

        self._futures.append(self._pool.submit(run))

    def drain(self) -> list[R]:
        wait(self._futures)
        self.raise_failure()
        return [future.result() for future in self._futures]

    def raise_failure(self) -> None:
        with self._lock:
            failure = self._failure
        if failure is not None:
            raise failure[1]
