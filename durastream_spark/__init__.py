"""durastream-spark: Apache Spark source and sink for Durable Streams (format ``durastream``).

The data source, its reader (``source/``) and its exactly-once writer (``sink/``) arrive in the issues that
build them; this package is laid out as the product will be.
"""

__version__ = "0.1.0"
