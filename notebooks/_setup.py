# Databricks notebook source
# MAGIC %md
# MAGIC # Shared set-up for the durastream notebooks
# MAGIC
# MAGIC Each notebook runs this one first with `%run ./_setup`, so the configuration lives in one place. It
# MAGIC defines `DURASTREAM_URL`, `AUTH_HEADER`, `STREAM_PREFIX`, `WORK_DIR`, `CONN` (the connection options
# MAGIC for every read and write) and `RUN_ID`. On Databricks they come from widgets and `dbutils.secrets`;
# MAGIC elsewhere from the environment variables `DURASTREAM_URL`, `DURASTREAM_AUTH_HEADER`,
# MAGIC `DURASTREAM_STREAM_PREFIX` and `DURASTREAM_WORK_DIR`. Import it into the same folder as the notebooks.

# COMMAND ----------

# Configuration: Databricks widgets and secrets where `dbutils` exists, environment variables elsewhere.
import os
import tempfile
import uuid

try:
    dbutils  # noqa: F821 (defined by Databricks)
    ON_DATABRICKS = True
except NameError:
    ON_DATABRICKS = False

if ON_DATABRICKS:
    dbutils.widgets.text("durastream_url", os.environ.get("DURASTREAM_URL", ""), "Stream root URL")
    dbutils.widgets.text("secret_scope", "", "Secret scope (auth header)")
    dbutils.widgets.text("secret_key", "durastream-auth-header", "Secret key (auth header)")
    dbutils.widgets.text("stream_prefix", "notebooks", "Stream path prefix")
    dbutils.widgets.text("work_dir", "/Volumes/main/default/durastream", "Checkpoints and files")
    DURASTREAM_URL = dbutils.widgets.get("durastream_url").strip()
    _scope = dbutils.widgets.get("secret_scope").strip()
    AUTH_HEADER = dbutils.secrets.get(_scope, dbutils.widgets.get("secret_key")) if _scope else None
    STREAM_PREFIX = dbutils.widgets.get("stream_prefix").strip("/ ")
    WORK_DIR = dbutils.widgets.get("work_dir").rstrip("/")
else:
    DURASTREAM_URL = os.environ.get("DURASTREAM_URL", "http://127.0.0.1:4437/v1/stream")
    AUTH_HEADER = os.environ.get("DURASTREAM_AUTH_HEADER") or None
    STREAM_PREFIX = os.environ.get("DURASTREAM_STREAM_PREFIX", "notebooks").strip("/ ")
    WORK_DIR = os.environ.get("DURASTREAM_WORK_DIR") or tempfile.mkdtemp(prefix="durastream-nb-")

    def display(df, n=20):  # Databricks' display(), locally
        df.show(n, truncate=False)

    try:
        spark  # noqa: F821 (defined by Databricks and by tests/notebooks)
    except NameError:
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.master("local[2]").appName("durastream-notebook").getOrCreate()

if not DURASTREAM_URL:
    raise ValueError(
        "Set the durastream_url widget (or DURASTREAM_URL) to the server's stream root"
    )

# Connection options for every read and write: the stream root and, if configured, the auth header.
CONN = {"url": DURASTREAM_URL}
if AUTH_HEADER:
    CONN["header.Authorization"] = AUTH_HEADER

RUN_ID = uuid.uuid4().hex[:8]  # every run of the notebook uses fresh streams and directories
print(f"server: {DURASTREAM_URL}, auth header: {'set' if AUTH_HEADER else 'none'}, run: {RUN_ID}")
