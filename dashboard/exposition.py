"""A metric family's exposition text, byte for byte what prometheus_client's `generate_latest` writes, made cheaply
when only the values changed.

Formatting a sample in prometheus_client costs ~7 us, most of it building and escaping the label part
(`name{gpu="0",model="..",node="..",uuid=".."} `), which never changes for a GPU. So prometheus_client renders
each family's HELP/TYPE head and each label set's text once (the label sets with a placeholder value), they are
kept, and a scrape joins them with each value formatted by prometheus_client's own `floatToGoString`. No Django
here: tests compare this text with `generate_latest` of the same family.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

Labels = tuple[str, ...]
Points = tuple[tuple[Labels, float], ...]

PLACEHOLDER = 0.0
PLACEHOLDER_END = f" {floatToGoString(PLACEHOLDER)}\n"


@dataclass(frozen=True)
class Family:
    """One metric family's inputs: the same points always render the same text."""

    name: str  # without _total for a counter (prometheus_client adds it)
    doc: str
    labels: Labels
    points: Points
    counter: bool = False

    @property
    def sample(self) -> str:
        return f"{self.name}_total" if self.counter else self.name

    def metric(self, points: Points | None = None) -> Metric:
        """The prometheus_client family of these points (or of other points with the same labels)."""
        kind = CounterMetricFamily if self.counter else GaugeMetricFamily
        family = kind(self.name, self.doc, labels=self.labels)
        for labels, value in self.points if points is None else points:
            family.add_sample(self.sample, _label_dict(self.labels, labels), value)  # one dict per series
        return family


@functools.lru_cache(maxsize=2**17)
def _label_dict(names: Labels, values: Labels) -> dict[str, str]:
    return dict(zip(names, values, strict=True))


class _One:
    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> list[Metric]:
        return [self.metric]


def render_plain(family: Family) -> bytes:
    """prometheus_client's own rendering of the family: the reference the fast path must equal."""
    return generate_latest(_One(family.metric()))


class ValueTexts(dict):
    """floatToGoString's text per value, kept: GPU readings repeat (whole degrees, MiB, MHz, percent).

    Zeros are not kept: 0.0 and -0.0 are one key but two texts. NaN is not equal to itself: never found, a key
    per NaN object would pile up, so it is not kept either. Any other equal values have the same text."""

    LIMIT = 2**16

    def __missing__(self, value: float) -> str:
        text = floatToGoString(value)
        if value and value == value:
            self[value] = text
        return text

    def bound(self) -> None:
        if len(self) > self.LIMIT:
            self.clear()


@dataclass
class FamilyText:
    """Renders families from kept pieces that prometheus_client rendered: HELP/TYPE and sample name per family,
    the label text per label set (per label names, shared by every family with those names)."""

    heads: dict[tuple, tuple[str, str]] = field(
        default_factory=dict
    )  # family -> (HELP/TYPE text, sample name)
    label_texts: dict[Labels, dict[Labels, str]] = field(default_factory=dict)  # names -> values -> '{..}'
    value_texts: ValueTexts = field(default_factory=lambda: ValueTexts())

    def render(self, family: Family) -> bytes:
        head, sample = self._head(family)
        self.value_texts.bound()
        try:
            lines = self._lines(sample, self.label_texts[family.labels], family.points)
        except KeyError:  # a label set (or the label names) not seen yet: rendered once, then kept
            lines = self._lines(sample, self._add_label_texts(family), family.points)
        return (head + "".join(lines)).encode()

    def _lines(self, sample: str, labels: dict[Labels, str], points: Points) -> list[str]:
        values = self.value_texts
        return [f"{sample}{labels[k]} {values[v]}\n" for k, v in points]

    def _head(self, family: Family) -> tuple[str, str]:
        key = (family.name, family.doc, family.counter)
        kept = self.heads.get(key)
        if kept is None:
            unlabelled = Family(family.name, family.doc, (), (((), PLACEHOLDER),), family.counter)
            head, sample, _ = render_plain(unlabelled).decode().rsplit("\n", 2)  # HELP, TYPE; the sample
            kept = self.heads[key] = (head + "\n", sample.removesuffix(PLACEHOLDER_END.rstrip("\n")))
        return kept

    def _add_label_texts(self, family: Family) -> dict[Labels, str]:
        known = self.label_texts.setdefault(family.labels, {})
        missing = list(dict.fromkeys(labels for labels, _ in family.points if labels not in known))
        if len(known) + len(missing) > 2 * len(family.points) + 1024:  # label sets gone (renamed nodes...)
            known.clear()
            missing = list(dict.fromkeys(labels for labels, _ in family.points))
        known.update(zip(missing, self._rendered_label_texts(family, missing), strict=True))
        return known

    @staticmethod
    def _rendered_label_texts(family: Family, missing: list[Labels]) -> list[str]:
        text = generate_latest(_One(family.metric(tuple((labels, PLACEHOLDER) for labels in missing))))
        lines = text.decode().split("\n")[2:-1]  # after HELP and TYPE; escaped label values hold no "\n"
        return [_label_text(line) for line in lines]


def _label_text(sample_line: str) -> str:
    """`{...}` of `name{...} 0.0` (a metric name holds no brace), or "" for a sample without labels."""
    start = sample_line.find("{")
    return sample_line[start : -len(PLACEHOLDER_END) + 1] if start >= 0 else ""
