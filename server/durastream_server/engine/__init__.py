"""Protocol semantics over storage: the ``Engine`` and its request/result values."""
