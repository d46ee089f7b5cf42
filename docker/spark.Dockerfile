# Spark 4 (pyspark), Java 17, the durastream connector and the bundled server: runs the demo pipeline.
#
# Build from the repository root (docker-compose.yml does):
#   docker build -f docker/spark.Dockerfile -t durastream-spark-demo .
#   docker run --rm durastream-spark-demo                       # bundled server inside the container
#   docker run --rm durastream-spark-demo --url http://HOST:4437/v1/stream --no-live
#
# Debian bookworm: its openjdk-17 is the Java 17 Spark 4 is tested with (trixie only has 21).
FROM python:3.12-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYSPARK_PYTHON=/usr/local/bin/python \
    PYSPARK_DRIVER_PYTHON=/usr/local/bin/python \
    SPARK_LOCAL_IP=127.0.0.1

# Both distributions, as a user would install them: the connector and the server (for the demo's
# bundled mode; with --url it is not used).
COPY pyproject.toml README.md /src/connector/
COPY durastream_spark/ /src/connector/durastream_spark/
COPY server/ /src/server/
RUN pip install /src/connector /src/server

RUN useradd --system --uid 10001 --create-home demo
USER demo
WORKDIR /home/demo

ENTRYPOINT ["python", "-m", "durastream_spark.demo"]
CMD ["--no-live"]
