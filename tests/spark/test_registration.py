"""The data source registers with a real local SparkSession under the name ``durastream``."""

from __future__ import annotations


def test_format_is_registered(spark) -> None:
    reader = (
        spark.read.format("durastream")
        .option("url", "http://127.0.0.1:1/v1/stream")
        .option("streams", "registration/probe")
    )
    schema = reader.load().schema
    assert schema.simpleString() == (
        "struct<stream:string,offset:string,value:binary,timestamp:timestamp>"
    )
