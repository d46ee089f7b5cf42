"""``/metrics`` of a server with ``--workers N``: every worker's exposition, one ``shard`` label apart.

The worker that receives a scrape renders its own figures and asks every other worker for theirs
(``shards/overview.py``); the texts are parsed back with ``prometheus_client``'s own parser, every
sample gets ``shard="<k>"``, and one exposition is written with each family's HELP and TYPE once.
Labels rather than sums: a Prometheus user sums with ``sum without (shard)`` when one figure is wanted,
but cannot split a sum again to see one worker lagging, and histograms and ``process_*`` (each
worker's memory and CPU) only mean something per process.

``durastream_shard_up{shard}`` says which shards' series are in the scrape (1) and which did not
answer in time or answered something unreadable (0: their series are absent), so a scrape with a
worker restarting is still a 200 with the other workers' figures.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

logger = logging.getLogger(__name__)

LABEL = "shard"
UP = "durastream_shard_up"


def _parsed(shard: int, text: bytes | None) -> list[Metric] | None:
    """The families of one worker's exposition; None when there is none or it does not parse."""
    if text is None:
        return None
    try:
        return list(text_string_to_metric_families(text.decode("utf-8")))
    except (ValueError, UnicodeDecodeError) as exc:
        logger.warning("the metrics of shard %d do not parse (%s): left out", shard, exc)
        return None


class _Merged:
    """A collector yielding every shard's families, labelled, then ``durastream_shard_up``."""

    def __init__(self, expositions: Mapping[int, bytes | None]) -> None:
        self._expositions = expositions

    def collect(self) -> Iterator[Metric]:
        families: dict[tuple[str, str], Metric] = {}  # first seen keeps its HELP and its place
        up = GaugeMetricFamily(
            UP,
            "1 when the shard's worker answered this scrape (its series are labelled shard), "
            "0 when it did not (restarting?): its series are absent.",
            labels=[LABEL],
        )
        for shard in sorted(self._expositions):
            parsed = _parsed(shard, self._expositions[shard])
            up.add_metric([str(shard)], 0 if parsed is None else 1)
            for family in parsed or ():
                merged = families.get((family.name, family.type))
                if merged is None:
                    merged = Metric(family.name, family.documentation, family.type, family.unit)
                    families[(family.name, family.type)] = merged
                merged.samples.extend(
                    sample._replace(labels={**sample.labels, LABEL: str(shard)})
                    for sample in family.samples
                )
        yield from families.values()
        yield up


def merged_exposition(expositions: Mapping[int, bytes | None]) -> bytes:
    """One Prometheus text exposition of every shard's (by shard index; None: it did not answer)."""
    return generate_latest(_Merged(expositions))  # type: ignore[arg-type]
