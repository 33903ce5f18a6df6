"""The Prometheus text of /metrics, made by prometheus_client in a long-lived render process of its own.

Why a process: at 1,000 nodes x 8 GPUs a scrape holds ~120,000 series and prometheus_client formats one in
~7 us. In the web process that half second of formatting shares the interpreter lock with the ingest of
8,000 samples/s, and the scrape took 1.0-1.8 s (bench/README.md). In its own process it runs on the other core.

The web process sends plain data (Family: names, label tuples, floats; no Django objects). The render process
keeps each family's text, so a family whose points did not change is sent by name only. A render process that
died or hangs past the timeout is killed; the scrape that saw it fails with RenderUnavailable (the view answers
503) and the next scrape starts a new one. This module imports only the standard library and prometheus_client:
it is all the render process loads.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import multiprocessing
import os
import signal
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

Labels = tuple[str, ...]
Points = tuple[tuple[Labels, float], ...]


@dataclass(frozen=True)
class Family:
    """One metric family's inputs: the same points always render the same text."""

    name: str  # without _total for a counter (prometheus_client adds it)
    doc: str
    labels: Labels
    points: Points
    counter: bool = False

    def metric(self) -> Metric:
        kind = CounterMetricFamily if self.counter else GaugeMetricFamily
        family = kind(self.name, self.doc, labels=self.labels)
        sample = f"{self.name}_total" if self.counter else self.name
        for labels, value in self.points:  # add_sample with one dict per series, not one per scrape
            family.add_sample(sample, _label_dict(self.labels, labels), value)
        return family


@functools.lru_cache(maxsize=2**17)
def _label_dict(names: Labels, values: Labels) -> dict[str, str]:
    return dict(zip(names, values, strict=True))


class _One:
    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> list[Metric]:
        return [self.metric]


def family_text(family: Family) -> bytes:
    return generate_latest(_One(family.metric()))


# ---- in the render process -------------------------------------------------------------------------------
_TEXTS: dict[str, bytes] = {}  # the render process's: each family's text, by name


def render_families(items: list[Family | str], compress: bool = False) -> tuple[bytes, float] | None:
    """The exposition (gzipped if `compress`) and this process's CPU seconds for it; a str is a family whose
    text is kept (None when it is not: the caller sends every family again)."""
    began = time.process_time()
    parts = []
    for item in items:
        if isinstance(item, str):
            text = _TEXTS.get(item)
            if text is None:
                return None
        else:
            text = _TEXTS[item.name] = family_text(item)
        parts.append(text)
    text = b"".join(parts)
    if compress:  # level 1: ~15 MB to ~1 MB in ~30 ms (prometheus_client's level 9 takes several times that)
        text = gzip.compress(text, compresslevel=1)
    return text, time.process_time() - began


# ---- in the web process ----------------------------------------------------------------------------------
class RenderUnavailable(Exception):
    """The render process died or did not answer in time; it was stopped and the next scrape starts another."""


@dataclass
class RenderProcess:
    """One render process, started on first use; `held` is the points it keeps text for, by family name."""

    timeout_s: float
    start_timeout_s: float = 60.0
    pool: ProcessPoolExecutor | None = None
    pid: int | None = None
    held: dict[str, Points] = field(default_factory=dict)

    def render(self, families: list[Family], compress: bool = False) -> tuple[bytes, float]:
        items = [f.name if self.held.get(f.name) == f.points else f for f in families]
        result = self._call(items, compress)
        if result is None:  # it lost texts it was thought to keep: send them all
            result = self._call(list(families), compress)
        self.held = {f.name: f.points for f in families}
        assert result is not None  # every family was sent, so none was missing
        return result

    def _call(self, items: list[Family | str], compress: bool) -> tuple[bytes, float] | None:
        pool = self._started()
        try:
            return pool.submit(render_families, items, compress).result(timeout=self.timeout_s)
        except TimeoutError as error:
            self.stop()
            raise RenderUnavailable(
                f"the metrics render process gave no answer in {self.timeout_s:g} s"
            ) from error
        except BrokenProcessPool as error:
            self.stop()
            raise RenderUnavailable("the metrics render process ended") from error

    def _started(self) -> ProcessPoolExecutor:
        if self.pool is None:
            # spawn: a fork would copy the web process's threads, locks and database connections
            self.pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
            try:
                self.pid = self.pool.submit(os.getpid).result(timeout=self.start_timeout_s)
            except (TimeoutError, BrokenProcessPool) as error:
                self.stop()
                raise RenderUnavailable("the metrics render process did not start") from error
        return self.pool

    def stop(self) -> None:
        """Kill the render process (a hung one does not exit when asked) and forget what it kept."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):  # it died already
                os.kill(self.pid, signal.SIGKILL)
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        self.pool, self.pid, self.held = None, None, {}
