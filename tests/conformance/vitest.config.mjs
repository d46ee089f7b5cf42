import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["conformance.test.mjs"],
    // One server, many streams: files run in one worker, tests in file order.
    fileParallelism: false,
    // Large-payload cases take ~4 s on a loaded 2-core machine; vitest's 5 s default made them flaky.
    testTimeout: 30_000,
    reporters: ["default"],
  },
})
