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

**Cost.** Parsing every worker's text and writing it again took most of a ``--workers 2`` scrape
(3.4 of its 6.5 ms). The texts the workers answer are ``generate_latest``'s own, so ``_Relabel``
works on their lines instead: it checks each line has exactly the form ``generate_latest`` writes
(the form ``prometheus_client``'s parser reads back and writes unchanged: one space between fields,
label names in sorted order, only the escapes it writes, a value as ``floatToGoString`` writes it),
puts ``shard="<k>"`` among the labels where sorting puts it, and groups the lines by family in first
seen order. The output is byte for byte what parsing and writing again gives (``tests/server/workers/
test_health.py`` compares them); any text with a line of another form is merged the slow way, whole,
so what the parser accepts or refuses (``durastream_shard_up`` 0) stays as it was. Merging two
181-line expositions: 3.4 -> about 0.5 ms; a ``--workers 2`` scrape 5.2 -> 2.1 ms (docs/server.md).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from typing import Final

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

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


_NAME: Final = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_HELP: Final = re.compile(rf"# HELP ({_NAME}) (.*)")
_HELP_TEXT: Final = re.compile(r"(?:[^\\]|\\[\\n])*")  # only the escapes generate_latest writes
_TYPE: Final = re.compile(rf"# TYPE ({_NAME}) (counter|gauge|histogram|summary)")
_PAIR: Final = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\[\\n"])*"'
_SAMPLE: Final = re.compile(rf"({_NAME})(?:\{{({_PAIR}(?:,{_PAIR})*)\}})? (\S+)")
_LABEL_NAME: Final = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')
# The sample names the parser keeps in a family of each type (its ``allowed_names``)
_SUFFIXES: Final = {
    "counter": ("",),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}


# A sample's labels -> where the shard label goes in them: label sets are few (routes, codes,
# buckets) and the same every scrape; bounded all the same.
_INSERTS: Final[dict[str, int]] = {}
_MAX_INSERTS: Final = 4096


class _NotCanonical(Exception):
    """A line not in the exact form ``generate_latest`` writes: the text is merged the slow way."""


class _Relabel:
    """Merges expositions line by line (module docstring, "Cost")."""

    def __init__(self) -> None:
        # (name, type) -> [HELP line, TYPE line, sample lines...], in first seen order
        self.families: dict[tuple[str, str], list[str]] = {}
        self._values: dict[str, bool] = {}  # value text -> written as floatToGoString writes it

    def add(self, shard: int, text: str) -> None:
        """Every line of one worker's exposition, its samples labelled ``shard``; raises
        ``_NotCanonical`` (leaving ``families`` partly filled) for a line of another form."""
        lines = text.split("\n")
        if lines.pop():  # the text ends with a newline
            raise _NotCanonical
        label = f'shard="{shard}"'
        seen: set[tuple[str, str]] = set()
        family: list[str] | None = None
        allowed: tuple[str, ...] = ()
        at = 0
        while at < len(lines):
            line = lines[at]
            if line.startswith("#"):
                family, allowed = self._family(lines, at, seen)
                at += 2
                continue
            match = _SAMPLE.fullmatch(line)
            if family is None or match is None or match[1] not in allowed:
                raise _NotCanonical
            if not self._canonical(match[3]):
                raise _NotCanonical
            family.append(self._labelled(line, match, label))
            at += 1

    def _labelled(self, line: str, match: re.Match[str], label: str) -> str:
        """``line`` with ``label`` among its labels where sorting puts it."""
        labels = match[2]
        if labels is None:
            return f"{match[1]}{{{label}}} {match[3]}"
        at = _INSERTS.get(labels)
        if at is None:  # label sets repeat (buckets, routes; every shard's, every scrape's)
            if len(_INSERTS) >= _MAX_INSERTS:
                _INSERTS.clear()
            at = _INSERTS[labels] = _insert_at(labels)
        if at == len(labels):
            return f"{match[1]}{{{labels},{label}}} {match[3]}"
        at += match.start(2)
        return f"{line[:at]}{label},{line[at:]}"

    def _family(
        self, lines: list[str], at: int, seen: set[tuple[str, str]]
    ) -> tuple[list[str], tuple[str, ...]]:
        """The family a HELP line and the TYPE line after it start; what its samples may be named."""
        help_match = _HELP.fullmatch(lines[at])
        type_match = _TYPE.fullmatch(lines[at + 1]) if at + 1 < len(lines) else None
        if help_match is None or type_match is None or help_match[1] != type_match[1]:
            raise _NotCanonical
        name, kind, doc = type_match[1], type_match[2], help_match[2]
        if doc != doc.strip() or not _HELP_TEXT.fullmatch(doc):
            raise _NotCanonical  # the parser would strip it or read an escape differently
        if (kind == "counter" and not name.endswith("_total")) or (name, kind) in seen:
            raise _NotCanonical  # written again under another name; or two blocks of one family
        seen.add((name, kind))
        family = self.families.setdefault((name, kind), [lines[at], lines[at + 1]])
        return family, tuple(name + suffix for suffix in _SUFFIXES[kind])

    def _canonical(self, value: str) -> bool:
        known = self._values.get(value)
        if known is None:
            try:
                known = floatToGoString(float(value)) == value
            except ValueError:
                known = False
            self._values[value] = known
        return known


def _insert_at(labels: str) -> int:
    """Where ``shard="<k>",`` goes in a sample's ``labels`` (their length: at the end, after a
    comma); raises ``_NotCanonical`` when the names are not sorted or hold ``shard``."""
    pairs = list(_LABEL_NAME.finditer(labels))
    names = [pair[1] for pair in pairs]
    if names != sorted(set(names)) or LABEL in names or "__name__" in names:
        raise _NotCanonical  # the parser would sort them, or refuse the line
    return next((pair.start() for pair in pairs if pair[1] > LABEL), len(labels))


def merged_exposition(expositions: Mapping[int, bytes | None]) -> bytes:
    """One Prometheus text exposition of every shard's (by shard index; None: it did not answer)."""
    relabel = _Relabel()
    try:
        for shard in sorted(expositions):
            text = expositions[shard]
            if text is not None:
                relabel.add(shard, text.decode("utf-8"))
    except (_NotCanonical, UnicodeDecodeError):
        return slow_merged_exposition(expositions)
    # durastream_shard_up as the slow path writes it: b"" parses (1), None does not (0)
    up = generate_latest(_Merged({k: None if v is None else b"" for k, v in expositions.items()}))  # type: ignore[arg-type]
    lines = [line for family in relabel.families.values() for line in family]
    return "".join(line + "\n" for line in lines).encode("utf-8") + up


def slow_merged_exposition(expositions: Mapping[int, bytes | None]) -> bytes:
    """``merged_exposition`` by parsing every text and writing it again: for texts not in
    ``generate_latest``'s exact form, and what the fast path is checked against."""
    return generate_latest(_Merged(expositions))  # type: ignore[arg-type]
