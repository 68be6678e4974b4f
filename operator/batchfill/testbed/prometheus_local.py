"""Run a real Prometheus server as a local subprocess that scrapes local tritonservers (component tests, demo).

The binary is Debian's ``prometheus`` package (2.42, ``/usr/bin/prometheus``). :class:`LocalPrometheus` writes
a configuration into a work directory of its own, with one scrape job whose targets come from a ``file_sd``
file. Each target carries the labels ``namespace`` and ``pod``, exactly as a ServiceMonitor labels the series of
a Triton pod in a cluster, so the operator's PromQL (:mod:`batchfill.adapters.metrics`) runs unchanged against
it. :meth:`LocalPrometheus.set_targets` rewrites the file (atomically) to add or remove pods while it runs;
Prometheus notices through inotify, and its discovery manager passes changes on at most every 5 s, so
:meth:`LocalPrometheus.wait_for_targets` waits until the active targets are the ones written.

Every socket binds to loopback. The server runs in its own process group, is started and waited for
(``/-/ready``) by :meth:`LocalPrometheus.start` and stopped by its own PID (SIGTERM, then SIGKILL of the group
after a grace period) by :meth:`LocalPrometheus.stop`. ``stop`` keeps the port and the TSDB, so ``start`` again
resumes the same server (an outage and its recovery); :meth:`LocalPrometheus.close` (or leaving the ``with``
block) also removes the work directory, unless a run failed or ``keep_dir`` is set.

:meth:`LocalPrometheus.backfill` writes history into the TSDB before the server starts, with Debian's
``promtool tsdb create-blocks-from openmetrics`` (the same package): a test of a query over the last 30 min
need not wait 30 min.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from batchfill.testbed.process import (
    LOOPBACK,
    LocalServer,
    Process,
    ProcessError,
    free_port,
    start_with_port_retries,
    tail,
)

DEFAULT_BINARY = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
#: How long promtool may take to write a backfill, seconds.
BACKFILL_TIMEOUT_S = 120.0
JOB = "triton"


class PrometheusStartError(RuntimeError):
    """prometheus is missing, exited, or did not become ready in time; the message ends with its log's tail."""


def _duration(seconds: float) -> str:
    """A Prometheus config duration (``1s``, ``500ms``; no decimals allowed)."""
    ms = round(seconds * 1000)
    if ms < 1:
        raise ValueError(f"duration {seconds!r} s is shorter than 1 ms")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


@dataclass(frozen=True)
class ScrapeTarget:
    """One metrics endpoint with the labels a ServiceMonitor would give a Triton pod's series.

    Attributes:
        address: ``host:port`` of the metrics endpoint (Prometheus' ``instance`` label).
        namespace: the ``namespace`` label.
        pod: the ``pod`` label.
        metrics_path: HTTP path of the exposition (Triton: ``/metrics``).
        labels: further target labels.
    """

    address: str
    namespace: str
    pod: str
    metrics_path: str = "/metrics"
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_url(cls, url: str, namespace: str, pod: str, **labels: str) -> ScrapeTarget:
        """From a full metrics URL such as :attr:`LocalTriton.metrics_url` (``http://127.0.0.1:8002/metrics``)."""
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or not u.netloc:
            raise ValueError(f"expected an http://host:port/path URL, got {url!r}")
        return cls(u.netloc, namespace, pod, u.path or "/metrics", labels)

    def file_sd_entry(self) -> dict[str, Any]:
        labels = {**self.labels, "namespace": self.namespace, "pod": self.pod, "__metrics_path__": self.metrics_path}
        return {"targets": [self.address], "labels": labels}


class LocalPrometheus(LocalServer):
    """A Prometheus server on loopback scraping ``targets``; use as a context manager.

    >>> with LocalPrometheus([ScrapeTarget.from_url(t.metrics_url, "ns1", "triton-a")]) as prom:  # doctest: +SKIP
    ...     prom.wait_for_targets()
    ...     prom.url   # 'http://127.0.0.1:<port>'

    Args:
        targets: initial scrape targets (change them later with :meth:`set_targets`).
        scrape_interval_s: scrape interval in seconds (1 s suits tests; a cluster typically uses 15-30 s).
        scrape_timeout_s: scrape timeout in seconds; by default the interval.
        port: fixed listen port; by default a free one (picked again, up to 3 times, if it was taken).
        binary: the prometheus executable.
        work_dir: where config, targets file, TSDB and log go; by default a new temporary directory.
        keep_dir: keep the work directory on :meth:`close`.
        retention: ``--storage.tsdb.retention.time``.
        startup_timeout_s: how long :meth:`start` waits for ``/-/ready``.
        stop_grace_s: how long :meth:`stop` waits after SIGTERM before SIGKILL.
        job: the scrape job name (``job`` label).
        extra_args: more command-line flags, e.g. ``--query.max-samples=500``.
    """

    def __init__(
        self,
        targets: Iterable[ScrapeTarget] = (),
        *,
        scrape_interval_s: float = 1.0,
        scrape_timeout_s: float | None = None,
        port: int | None = None,
        binary: str | os.PathLike[str] = DEFAULT_BINARY,
        work_dir: str | os.PathLike[str] | None = None,
        keep_dir: bool = False,
        retention: str = "2h",
        startup_timeout_s: float = 30.0,
        stop_grace_s: float = 10.0,
        job: str = JOB,
        extra_args: Iterable[str] = (),
    ) -> None:
        timeout = scrape_interval_s if scrape_timeout_s is None else scrape_timeout_s
        if not (0 < timeout <= scrape_interval_s):
            raise ValueError(f"scrape timeout {timeout} s must be in (0, scrape interval {scrape_interval_s} s]")
        self.scrape_interval_s = scrape_interval_s
        self.scrape_timeout_s = timeout
        self._fixed_port = port
        self.port = port or 0
        self.binary = Path(binary)
        self._given_dir = Path(work_dir) if work_dir is not None else None
        self.work_dir: Path | None = None
        self.keep_dir = keep_dir
        self.retention = retention
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.job = job
        self.extra_args = list(extra_args)
        self._targets: list[ScrapeTarget] = list(targets)
        self._process: Process | None = None
        self._failed = False

    # -- addresses and files ----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """Base URL of the HTTP API, e.g. ``http://127.0.0.1:9090``."""
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def targets(self) -> list[ScrapeTarget]:
        return list(self._targets)

    def _dir(self) -> Path:
        if self.work_dir is None:
            if self._given_dir is not None:
                self._given_dir.mkdir(parents=True, exist_ok=True)
                self.work_dir = self._given_dir
            else:
                self.work_dir = Path(tempfile.mkdtemp(prefix="batchfill-prometheus-"))
        return self.work_dir

    @property
    def log_path(self) -> Path:
        return self._dir() / "prometheus.log"

    @property
    def targets_path(self) -> Path:
        return self._dir() / "targets.json"

    def config(self) -> dict[str, Any]:
        """The prometheus.yml content: one ``file_sd`` job on :attr:`targets_path`."""
        return {
            "global": {
                "scrape_interval": _duration(self.scrape_interval_s),
                "scrape_timeout": _duration(self.scrape_timeout_s),
                "evaluation_interval": _duration(max(self.scrape_interval_s, 1.0)),
            },
            "scrape_configs": [
                {
                    "job_name": self.job,
                    "file_sd_configs": [
                        {
                            "files": [str(self.targets_path)],
                            "refresh_interval": _duration(max(1.0, self.scrape_interval_s)),
                        }
                    ],
                }
            ],
        }

    def set_targets(self, targets: Iterable[ScrapeTarget]) -> None:
        """Replace the scrape targets (an atomic rewrite of the file_sd file; effective within about 5 s)."""
        self._targets = list(targets)
        self._write_targets()

    def _write_targets(self) -> None:
        path = self.targets_path
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps([t.file_sd_entry() for t in self._targets], indent=1))
        tmp.replace(path)

    # -- lifecycle --------------------------------------------------------------------------------------
    def command(self) -> list[str]:
        d = self._dir()
        return [
            str(self.binary),
            f"--config.file={d / 'prometheus.yml'}",
            f"--storage.tsdb.path={d / 'data'}",
            f"--storage.tsdb.retention.time={self.retention}",
            f"--web.listen-address={LOOPBACK}:{self.port}",
            "--log.level=info",
            *self.extra_args,
        ]

    def backfill(self, openmetrics: str, promtool: str | os.PathLike[str] = PROMTOOL) -> None:
        """Write ``openmetrics`` (OpenMetrics text ending in ``# EOF``, timestamps in Unix seconds) into the TSDB
        as blocks; call before :meth:`start`. Series without a ``# TYPE`` line keep their names as written.

        Raises :class:`PrometheusStartError` with promtool's output when it fails or takes longer than
        :data:`BACKFILL_TIMEOUT_S`.
        """
        if self._process is not None:
            raise RuntimeError("backfill before start: the server owns a running TSDB")
        source = self._dir() / "backfill.om"
        source.write_text(openmetrics)
        command = [str(promtool), "tsdb", "create-blocks-from", "openmetrics", str(source), str(self._dir() / "data")]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=BACKFILL_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PrometheusStartError(f"{' '.join(command)}: {e}") from e
        if done.returncode != 0:
            raise PrometheusStartError(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")

    def start(self) -> LocalPrometheus:
        """Write config and targets, start the server and wait for ``/-/ready``.

        Raises :class:`PrometheusStartError` (with the log's tail) when it exits or is not ready in
        ``startup_timeout_s``; a free port taken before the server bound it is picked again (3 tries).
        """
        if self._process is not None:
            raise RuntimeError("prometheus is already running")
        if not os.access(self.binary, os.X_OK):
            raise PrometheusStartError(f"{self.binary} is not an executable (apt-get install prometheus)")
        d = self._dir()
        (d / "prometheus.yml").write_text(yaml.safe_dump(self.config(), sort_keys=False))
        self._write_targets()
        keep_port = bool(self._fixed_port or self.port)  # a restart after stop() keeps its port
        try:
            return start_with_port_retries(
                lambda: self._start_once(keep_port), attempts=1 if keep_port else 3, stop=self.stop,
                log_tail=self.log_tail,
            )  # fmt: skip
        except PrometheusStartError:
            self._failed = True
            raise

    def _start_once(self, keep_port: bool) -> LocalPrometheus:
        if not keep_port:
            self.port = free_port()
        self._process = Process.start(self.command(), self.log_path, name="prometheus", cwd=self._dir())
        self.wait_ready(self.startup_timeout_s)
        return self

    def _get(self, path: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout_s) as r:
                return int(r.status), bytes(r.read())
        except urllib.error.HTTPError as e:
            return int(e.code), bytes(e.read())

    def wait_ready(self, timeout_s: float) -> None:
        """Block until ``/-/ready`` answers 200; raise :class:`PrometheusStartError` otherwise."""
        if self._process is None:
            raise PrometheusStartError("prometheus is not running")
        try:
            self._process.wait_ready(lambda: self._get("/-/ready", 1.0)[0] == 200, timeout_s, where=self.url)
        except ProcessError as e:
            raise PrometheusStartError(f"{e}\n{self.log_tail()}") from None

    def api(self, path: str, **params: str) -> Any:
        """``data`` of a JSON answer of the HTTP API (``api("/api/v1/query", query="up")``)."""
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        status, body = self._get(path + query, 5.0)
        doc = json.loads(body)
        if status != 200 or doc.get("status") != "success":
            raise RuntimeError(f"GET {path}{query}: HTTP {status}: {body[:300]!r}")
        return doc["data"]

    def active_targets(self) -> list[dict[str, Any]]:
        """The active targets as ``/api/v1/targets`` reports them (``labels``, ``health``, ``lastError``...)."""
        return list(self.api("/api/v1/targets", state="active")["activeTargets"])

    def wait_for_targets(self, timeout_s: float = 20.0, *, healthy: bool = True) -> list[dict[str, Any]]:
        """Wait until the active targets are exactly the written ones (and, if ``healthy``, all scraped ``up``)."""
        want = {(t.namespace, t.pod, t.address) for t in self._targets}
        deadline = time.monotonic() + timeout_s
        while True:
            active = self.active_targets()
            have = {(a["labels"].get("namespace"), a["labels"].get("pod"), a["labels"].get("instance")) for a in active}
            if have == want and (not healthy or all(a.get("health") == "up" for a in active)):
                return active
            if time.monotonic() > deadline:
                seen = [(a["labels"].get("pod"), a.get("health"), a.get("lastError")) for a in active]
                raise TimeoutError(f"Prometheus targets after {timeout_s:.0f} s: {seen}; expected {sorted(want)}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 20) -> str:
        return "" if self.work_dir is None else tail(self.log_path, lines)

    def stop(self) -> int | None:
        """SIGTERM, wait ``stop_grace_s``, then SIGKILL the server's process group; keeps port and TSDB."""
        process, self._process = self._process, None
        return process.stop(self.stop_grace_s) if process is not None else None

    def close(self) -> None:
        """:meth:`stop`, then remove the work directory (kept if a run failed or ``keep_dir``)."""
        code = self.stop()
        if code not in (None, 0):
            self._failed = True
        if self.work_dir is not None and not self.keep_dir and not self._failed and self._given_dir is None:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.work_dir = None


@contextlib.contextmanager
def local_prometheus(targets: Iterable[ScrapeTarget] = (), **kwargs: Any) -> Iterator[LocalPrometheus]:
    """Functional form of :class:`LocalPrometheus`."""
    with LocalPrometheus(targets, **kwargs) as p:
        yield p
