// Runs the official Durable Streams conformance suite against a running server.
// The pytest wrapper (tests/server/test_conformance.py) starts durastream-server and sets DURASTREAM_BASE_URL.
import { describe } from "vitest"
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

const baseUrl = process.env.DURASTREAM_BASE_URL
if (!baseUrl) {
  throw new Error("DURASTREAM_BASE_URL is not set: start a server and point this suite at it")
}

describe("durastream-server", () => {
  runConformanceTests({
    baseUrl,
    subscriptions: process.env.CONFORMANCE_SUBSCRIPTIONS === "1",
  })
})
