"""``durastream-server check`` and ``durastream-server inspect``: offline tools for a data directory.

``check`` verifies every file the server would read (``datacheck.py``) and exits 1 on damage, 0
otherwise (findings the server repairs by itself at start-up are listed, and do not fail the check).
It refuses a directory a running server holds: it takes the data directory's lock (shared, so two
checks may run together) for as long as it reads, so no server can start on the directory meanwhile;
``--force`` reads without the lock, for a copy whose ``LOCK`` file came along, never for a live one.

``inspect`` prints what each stream holds: size, tail offset, closure, TTL, and every producer with its
epoch and last sequence number (what a 409 from the server is measured against). It takes no lock:
on a live directory it shows what is durable on disk at that moment.

Both print text for people and, with ``--json``, one JSON document for machines. They never write.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from durastream_server.datacheck import DirectoryReport, StreamReport, verify_dir
from durastream_server.offsets import format_offset

COMMANDS = ("check", "inspect")
EXIT_OK = 0
EXIT_DAMAGE = 1
EXIT_USAGE = 2


def build_parser(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"durastream-server {command}",
        description=(
            "Verify every record, snapshot, index, staging file and subscription of a data directory, "
            "read-only; exit 1 on damage."
            if command == "check"
            else "Show each stream's size, tail, closure, TTL and producers, read from the data directory."
        ),
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path("./durastream-data"),
        help="the server's data directory (default: ./durastream-data)",
    )
    parser.add_argument(
        "--json", action="store_true", help="one JSON document instead of text (default: text)"
    )
    if command == "check":
        parser.add_argument(
            "--force",
            action="store_true",
            help="read even if the directory's lock is held: only for a copy (default: refuse)",
        )
    else:
        parser.add_argument(
            "stream", nargs="?", help="only the stream at this path, e.g. tenant-a/orders"
        )
    return parser


def _stream_as_dir_hint(args: argparse.Namespace) -> str:
    """``inspect /srv/data`` reads the directory as a stream path: say what was meant."""
    stream = getattr(args, "stream", None)
    if stream and (Path(stream) / "streams").is_dir():
        return f" ('{stream}' is a data directory: did you mean --data-dir {stream}?)"
    return ""


def main(argv: Sequence[str]) -> int:
    command, rest = argv[0], list(argv[1:])
    args = build_parser(command).parse_args(rest)
    root: Path = args.data_dir
    if not (root / "streams").is_dir():
        print(
            f"durastream-server {command}: error: {root} is not a durastream data directory "
            f"(no streams/ in it); give the server's --data-dir{_stream_as_dir_hint(args)}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if command == "inspect":
        return _inspect(root, args.stream, as_json=args.json)
    lock = None if args.force else _share_lock(root)
    if lock == -1:
        print(
            f"durastream-server check: error: {root} is held by a running server (its LOCK); stop "
            "the server, or check a copy of the directory with --force",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        report = verify_dir(root)
    finally:
        if lock is not None:
            os.close(lock)
    _print_check(report, as_json=args.json)
    return EXIT_DAMAGE if report.damaged else EXIT_OK


def _share_lock(root: Path) -> int | None:
    """A shared lock on ``LOCK`` (held while reading): the fd, None without a LOCK file, -1 if a
    server holds it. Opened read-only: the check never creates or writes a file."""
    try:
        fd = os.open(root / "LOCK", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return -1
        raise
    return fd


def _stream_json(stream: StreamReport) -> dict[str, Any]:
    document = asdict(stream)
    document["status"] = stream.status
    document["tail_offset"] = None if stream.tail is None else format_offset(stream.tail)
    return document


def _print_check(report: DirectoryReport, *, as_json: bool) -> None:
    rate = report.bytes_read / report.seconds / 1e6 if report.seconds > 0 else 0.0
    if as_json:
        document = {
            "data_dir": report.root,
            "damaged": report.damaged,
            "streams": [_stream_json(stream) for stream in report.streams],
            "findings": [asdict(finding) for finding in report.findings],
            "quarantined": report.quarantined,
            "subscriptions": report.subscriptions,
            "bytes_read": report.bytes_read,
            "seconds": round(report.seconds, 3),
        }
        print(json.dumps(document, indent=2))
        return
    for stream in report.streams:
        print(
            f"{stream.status:<10} {stream.path or '?'} (id {stream.id}): {stream.messages or 0} messages, "
            f"{stream.bytes_on_disk} bytes in {stream.segments} segment(s), snapshot {stream.snapshot}, "
            f"{stream.staged_handles} staged handle(s)"
        )
        for finding in stream.findings:
            print(f"    {finding.severity}: {finding.kind}: {finding.message}")
    for finding in report.findings:
        print(f"{finding.severity}: {finding.kind}: {finding.message}")
    for entry in report.quarantined:
        print(f"quarantined {entry['path'] or '?'} (id {entry['id']}): {entry['reason']}")
    damaged = sum(stream.status == "damaged" for stream in report.streams)
    repairable = sum(stream.status == "repairable" for stream in report.streams)
    print(
        f"checked {len(report.streams)} streams, {report.subscriptions} subscriptions, "
        f"{report.bytes_read} bytes in {report.seconds:.2f} s ({rate:.0f} MB/s): "
        f"{damaged} damaged, {repairable} repairable, {len(report.quarantined)} quarantined"
        + (" -- DAMAGE FOUND" if report.damaged else "")
    )


def _inspect(root: Path, only: str | None, *, as_json: bool) -> int:
    report = verify_dir(root, only=only.strip("/") if only else None)
    if only and not report.streams:
        print(f"durastream-server inspect: no stream at path {only!r} in {root}", file=sys.stderr)
        return EXIT_DAMAGE
    if as_json:
        print(json.dumps({"streams": [_stream_json(s) for s in report.streams]}, indent=2))
        return EXIT_OK
    for stream in report.streams:
        tail = "?" if stream.tail is None else format_offset(stream.tail)
        print(f"{stream.path or '?'}  (id {stream.id}, {stream.status})")
        print(f"  content type  {stream.content_type}")
        print(f"  messages      {stream.messages}, tail {tail} ({stream.tail} bytes)")
        print(f"  on disk       {stream.bytes_on_disk} bytes in {stream.segments} segment(s)")
        print(f"  closed        {'yes' if stream.closed else 'no'}")
        if stream.ttl_seconds is not None or stream.expires_at is not None:
            print(f"  expiry        ttl {stream.ttl_seconds} s, expires at {stream.expires_at}")
        if stream.fork_of:
            print(f"  forked from   {stream.fork_of}")
        if stream.last_stream_seq is not None:
            print(f"  Stream-Seq    {stream.last_stream_seq}")
        if stream.staged_handles:
            print(f"  staged        {stream.staged_handles} handle(s), {stream.staged_bytes} bytes")
        for producer_id, producer in stream.producers.items():
            print(
                f"  producer      {producer_id}: epoch {producer['epoch']}, "
                f"last seq {producer['last_seq']}"
            )
        for finding in stream.findings:
            print(f"  {finding.severity}: {finding.kind}: {finding.message}")
    return EXIT_OK
