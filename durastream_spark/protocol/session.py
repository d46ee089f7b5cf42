"""One ``requests.Session`` per Python worker process and connection configuration, created on first use.

Why a process-wide cache: Spark pickles readers, writers and partitions and reuses Python workers across
tasks (``spark.python.worker.reuse``), so a session created in ``__init__`` would either fail to pickle or be
rebuilt per task, paying a TCP (and TLS) handshake for every task. A module-level cache keyed by the
transport configuration lets every task in a worker share one keep-alive pool per server.

Why fork-safety: PySpark's daemon forks workers, and a session created before a fork shares its sockets with
the child; two processes writing on one TCP connection corrupt both exchanges. The cache records the pid that
built it and is dropped in a forked child (``os.register_at_fork`` plus a pid check on every lookup, in case a
fork bypasses the hook). The parent's sockets are only dereferenced in the child, never shut down.

Sessions never follow redirects (the client passes ``allow_redirects=False``), never keep cookies (a cookie
set for one configuration must not authenticate another) and do not retry by themselves (``max_retries=0``):
``retry.py`` decides what may be repeated.
"""

from __future__ import annotations

import http.cookiejar
import logging
import os
import threading
from urllib.parse import urlsplit

import requests
import requests.adapters

from durastream_spark import __version__
from durastream_spark.options import ConnectionOptions

log = logging.getLogger(__name__)

USER_AGENT = f"durastream-spark/{__version__} python-requests/{requests.__version__}"

SessionKey = tuple[str, bool | str, int]

_lock = threading.Lock()
_sessions: dict[SessionKey, requests.Session] = {}
_owner_pid = os.getpid()


def session_key(connection: ConnectionOptions) -> SessionKey:
    """What makes two configurations need different pools: the server origin, TLS trust and pool size.

    Headers are not part of it: they are sent per request, so options that differ only in headers share
    the keep-alive connections to the same server.
    """
    parts = urlsplit(connection.url)
    origin = f"{parts.scheme}://{parts.netloc}".lower()
    return (origin, connection.verify, connection.max_connections)


def _new_session(connection: ConnectionOptions) -> requests.Session:
    session = requests.Session()
    adapter = requests.adapters.HTTPAdapter(
        pool_connections=4,
        pool_maxsize=connection.max_connections,
        max_retries=0,
        pool_block=False,
    )
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.verify = connection.verify
    session.headers["User-Agent"] = USER_AGENT
    session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
    return session


def _forget_after_fork() -> None:
    global _lock, _owner_pid
    # The lock may have been held by another thread at fork time; in the child nobody will release it.
    _lock = threading.Lock()
    _sessions.clear()
    _owner_pid = os.getpid()


os.register_at_fork(after_in_child=_forget_after_fork)


def get_session(connection: ConnectionOptions) -> requests.Session:
    """The session of this process for ``connection``'s server, created on first use."""
    key = session_key(connection)
    if _owner_pid != os.getpid():
        _forget_after_fork()
    session = _sessions.get(key)
    if session is not None:
        return session
    with _lock:
        session = _sessions.get(key)
        if session is None:
            session = _new_session(connection)
            _sessions[key] = session
            log.debug("new HTTP session for %s in pid %d", key[0], os.getpid())
        return session


def close_sessions() -> None:
    """Close every session of this process (tests, and long-lived drivers that want to drop idle sockets)."""
    with _lock:
        sessions = list(_sessions.values())
        _sessions.clear()
    for session in sessions:
        session.close()
