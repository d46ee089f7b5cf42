"""Producers under repeated disk fills: what the server acknowledged must be exactly what it stores.

The chaos soak's ``disk_full`` fault, alone and repeated: a real server on a 64 MiB tmpfs (needs root),
three of the soak's idempotent producers appending as fast as they can, and ``CYCLES`` times the tmpfs
filled with a ballast file, held 0.7-1.9 s, emptied. Each producer retries a failed request with the
same tuple until it is acknowledged; at the end the stream is read back and every producer's stored
message count must equal its acknowledged one (and no producer may have met a 409). It found the
duplicate decided on a poisoned log's state and acknowledged after its heal (``StreamLog.durable_barrier``):
before that fix about every second run of 20 cycles lost one request's messages.

Run: ``python bench/enospc_producers.py WORKDIR [CYCLES]`` (WORKDIR is emptied; its ``server.log`` and
``faults.log`` stay for a look).
"""

import shutil
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))
import soak  # noqa: E402

from tests.support.server_process import ServerProcess  # noqa: E402

work = Path(sys.argv[1])
cycles = int(sys.argv[2]) if len(sys.argv) > 2 else 20
TRACE: dict[str, list] = {}  # each producer's acknowledgements: seq, duplicate, offset, times


def traced_send(self, body, seq):
    client = self.client
    orig = client.append

    def append(*a, **k):
        t = time.time()
        result = orig(*a, **k)
        TRACE.setdefault(self.producer_id, []).append(
            (seq, result.duplicate, result.next_offset, round(t, 3), round(time.time(), 3))
        )
        return result

    client.append = append
    try:
        return soak.Producer._orig_send(self, body, seq)
    finally:
        client.append = orig


soak.Producer._orig_send = soak.Producer._send
soak.Producer._send = traced_send
shutil.rmtree(work, ignore_errors=True)
work.mkdir(parents=True)
log = soak.Log(work / "faults.log")
disk = soak.Disk(work / "data", 64, allow_mount=True, log=log)
assert disk.mode == "tmpfs"
server = ServerProcess(disk.path / "d", log_path=work / "server.log").start()
try:
    url = server.base_url + "/v1/stream"
    r = requests.put(f"{url}/{soak.STREAM_A}", headers={"Content-Type": "application/json"})
    r.raise_for_status()
    producers = [soak.Producer(f"prod-{i}", url, 9, 4000.0, log) for i in range(3)]
    for p in producers:
        p.start()
    time.sleep(1)
    for c in range(cycles):
        filled = disk.fill()
        log("fill", c, mb=filled / 2**20)
        time.sleep(0.7 + (c % 5) * 0.3)
        disk.release()
        time.sleep(0.8)
        if any(p.failed for p in producers):
            break
    for p in producers:
        p.stop_event.set()
    for p in producers:
        p.join(30)
    acked = {p.producer_id: p.acked for p in producers}
    failed = {p.producer_id: p.failed for p in producers if p.failed}
    # read back
    offset, counts = "-1", {}
    while True:
        r = requests.get(f"{url}/{soak.STREAM_A}", params={"offset": offset})
        r.raise_for_status()
        for m in r.json():
            counts[m["p"]] = counts.get(m["p"], 0) + 1
        offset = r.headers["Stream-Next-Offset"]
        if r.headers.get("Stream-Up-To-Date") == "true":
            break
    print("acked", acked, "stored", counts, "failed", failed, flush=True)
    for pid in failed:
        print(pid, "last acks:", TRACE.get(pid, [])[-4:], flush=True)
    print("RESULT", "OK" if acked == counts and not failed else "MISMATCH", flush=True)
finally:
    server.stop()
    disk.unmount()
