"""The durastream sink: each partition writes as an idempotent producer keyed by (query, partition, epoch)."""
