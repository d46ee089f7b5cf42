"""Worker processes that own shards of the streams (decision 0009, ``--workers N``)."""
