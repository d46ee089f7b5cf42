"""The durastream source: stream offsets mapped to replay-deterministic micro-batch offsets."""
