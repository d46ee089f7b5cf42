import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["conformance.test.mjs"],
    // One server, many streams: files run in one worker, tests in file order.
    fileParallelism: false,
    reporters: ["default"],
  },
})
