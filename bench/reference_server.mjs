// Starts the Node reference server (@durable-streams/server) on its file-backed store, for
// bench/server_bench.py.
// Usage: node reference_server.mjs <port> <data-dir> [long-poll-timeout-ms] [max-file-handles]
// Prints "READY <url>" once it listens; stops cleanly on SIGTERM/SIGINT.
import { DurableStreamTestServer, FileBackedStreamStore } from "@durable-streams/server"

const [port, dataDir, longPollMs, maxHandles] = process.argv.slice(2)
if (!port || !dataDir) {
  console.error(
    "usage: node reference_server.mjs <port> <data-dir> [long-poll-timeout-ms] [max-file-handles]"
  )
  process.exit(2)
}

const server = new DurableStreamTestServer({
  port: Number(port),
  host: "127.0.0.1",
  longPollTimeout: Number(longPollMs ?? 30000),
  // Identity bodies on both servers: the benchmark client sends no Accept-Encoding anyway.
  compression: false,
})
// The same file-backed store that `dataDir` selects, but with a larger file-handle pool: with its
// default of 100 handles, an append whose handle is evicted between its write and its fdatasync fails
// ("Cannot fsync: handle not found" -> 404), which happens as soon as more than 100 streams are written
// at once (the 1,000-stream RSS benchmark). Constructed before start(), so nothing used the default store.
server.store = new FileBackedStreamStore({
  dataDir,
  maxFileHandles: Number(maxHandles ?? 2048),
})
server.options.dataDir = dataDir

const url = await server.start()
console.log(`READY ${url}`)

let stopping = false
async function stop() {
  if (stopping) return
  stopping = true
  await server.stop()
  process.exit(0)
}
process.on("SIGTERM", stop)
process.on("SIGINT", stop)
