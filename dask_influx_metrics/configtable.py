"""The settings table: each setting declared once, a :class:`Setting` row (config key, attribute, default,
parser, unit, doc, keywords). :mod:`.config` resolves it through dask.config; :mod:`.configdocs` writes the
YAML defaults and docs/settings.md from it."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from . import settingparsers


# --- the table -------------------------------------------------------------------------------------
class Setting(NamedTuple):
    """One setting, declared once."""

    key: str  # below ``influx-metrics``, dotted: "telegraf.address"
    attr: str  # the Settings attribute
    default: Any  # the YAML default (before parsing)
    parse: Callable  # config value -> Python value; raises ValueError("must be ...")
    unit: str  # "ms", "s", "bytes", ... or ""
    doc: str  # one line for the YAML comment and docs/settings.md
    keywords: tuple = ()  # Monitor/attach keywords; () means (attr,)
    secret: bool = False  # hidden from repr

    @property
    def kwargs(self) -> tuple:
        return self.keywords or (self.attr,)


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "polling-interval",
        "polling_interval",
        200,
        settingparsers.number(
            f"a number of ms from 1 to {settingparsers.MAX_POLLING_INTERVAL}",
            minimum=1,
            maximum=settingparsers.MAX_POLLING_INTERVAL,
        ),
        "ms",
        f"time between samples (at most {settingparsers.MAX_POLLING_INTERVAL}: one minute)",
    ),
    Setting(
        "tracking",
        "tracking",
        None,
        settingparsers.tracking,
        "",
        "metric names to collect; null = all (see schema.TRACKING)",
    ),
    Setting(
        "job-type",
        "job_type",
        "client",
        settingparsers.choice(settingparsers.JOB_TYPES),
        "",
        "client: each client connection is a job; manual: only new_job() starts one",
    ),
    Setting(
        "sink",
        "sinks",
        settingparsers.AUTO,
        settingparsers.sinks,
        "",
        "where samples go: auto (udp if telegraf.address is set, else http if influxdb.url is, else spool), "
        "udp, http, spool, or a list such as [udp, spool]",
        keywords=("sink",),
    ),
    Setting("tags", "tags", {}, settingparsers.tags, "", "extra tags written on every point, e.g. {cluster: prod-a}"),
    Setting(
        "dag-tag",
        "dag_tag",
        True,
        settingparsers.boolean,
        "",
        "true: dag is a tag of every sample (one series per DAG, worker and device); false: a string "
        "field, so the series count does not grow with the number of DAGs (job stays a tag)",
    ),
    Setting(
        "session-tag",
        "session_tag",
        True,
        settingparsers.boolean,
        "",
        "true: session (the monitoring session's id) is a tag of every point, so readers select one session "
        "exactly; false: a string field, so each session adds no series (readers then find a session by its "
        "field: InfluxQL and the spool exactly, Flux by its time range)",
    ),
    Setting(
        "telegraf.address",
        "telegraf_address",
        None,
        settingparsers.optional_address,
        "",
        "node-local Telegraf UDP listener (host:port), read on each worker; null = not configured "
        "(the udp sink then uses 127.0.0.1:8094)",
    ),
    Setting(
        "telegraf.max-datagram",
        "max_datagram",
        settingparsers.AUTO,
        settingparsers.max_datagram,
        "bytes",
        "largest UDP datagram; auto: 65507 (the UDP maximum) when telegraf.address is this machine's "
        "(loopback or one of its own addresses), else 1472 (fits a 1500-byte MTU); neither is fragmented",
    ),
    Setting(
        "influxdb.url",
        "influxdb_url",
        None,
        settingparsers.url,
        "",
        "InfluxDB for the http sink and for queries (http:// or https://); null = not configured "
        "(http://127.0.0.1:8086 is used)",
    ),
    Setting(
        "influxdb.database",
        "database",
        "dask_metrics",
        settingparsers.text,
        "",
        "1.x database, or the DBRP-mapped database on 2.x",
    ),
    Setting(
        "influxdb.retention-policy",
        "retention_policy",
        None,
        settingparsers.optional_text,
        "",
        "retention policy; null = the database's default",
    ),
    Setting("influxdb.username", "username", None, settingparsers.optional_text, "", "1.x user name"),
    Setting("influxdb.password", "password", None, settingparsers.optional_text, "", "1.x password", secret=True),
    Setting(
        "influxdb.token",
        "token",
        None,
        settingparsers.optional_text,
        "",
        "InfluxDB 2.x/3.x token (sent as 'Authorization: Token ...')",
        secret=True,
    ),
    Setting(
        "influxdb.create-database",
        "create_database",
        True,
        settingparsers.boolean,
        "",
        "http sink: when a write answers 'database not found', create it (CREATE DATABASE on /query, "
        "InfluxDB 1.x, as Telegraf does) and write again; false: never (the lines go to undelivered/)",
    ),
    Setting("influxdb.batch-size", "batch_size", 5000, settingparsers.positive_int, "lines", "size of one HTTP write"),
    Setting("influxdb.timeout", "http_timeout", 5, settingparsers.seconds, "s", "time limit per HTTP request"),
    Setting(
        "spool.directory",
        "spool_directory",
        None,
        settingparsers.directory,
        "",
        "spool root; null = dask-influx-metrics-<uid> in the temporary directory, private to the user",
        keywords=("spool_directory", "dump_loc"),
    ),
    Setting(
        "spool.mem-limit",
        "mem_limit",
        1000,
        settingparsers.positive_int,
        "lines",
        "held in the sampling process's memory before being appended to disk",
    ),
    Setting(
        "spool.flush-interval",
        "flush_interval",
        1,
        settingparsers.seconds,
        "s",
        "buffered lines reach disk at least this often",
    ),
    Setting(
        "gpu.source",
        "gpu_source",
        "auto",
        settingparsers.choice(settingparsers.GPU_SOURCES, null="none"),
        "",
        "auto (NVML if present, else none), nvml, simulated, none (also null, off, false)",
    ),
    Setting(
        "gpu.count",
        "gpu_count",
        1,
        settingparsers.number(
            f"an integer from 1 to {settingparsers.MAX_GPUS}", maximum=settingparsers.MAX_GPUS, integer=True
        ),
        "",
        "simulated devices per worker (gpu.source: simulated)",
    ),
    Setting(
        "gpu.devices",
        "gpu_devices",
        "auto",
        settingparsers.choice(settingparsers.GPU_DEVICES),
        "",
        "GPUs a worker reports: first (its own under dask-cuda), all visible, or auto (first when "
        "CUDA_VISIBLE_DEVICES is set, else all)",
    ),
    Setting(
        "gpu.gpm-window",
        "gpm_window",
        100,
        settingparsers.number("a number of ms >= 100 (NVML's GPM refresh)", minimum=100),
        "ms",
        "GPM metrics (sm_active, sm_occupancy, tensor, DRAM, ...; Hopper+) are computed over windows of "
        "at least this long: one GPM sample per GPU every ceil(window / polling interval) samples",
    ),
    Setting(
        "gpu.process-interval",
        "process_interval",
        1000,
        settingparsers.number("a number of ms > 0"),
        "ms",
        "a shared GPU's per-process utilization (worker_utilization_*; ~2 ms per GPU and call on an H100) "
        "is read at most this often",
    ),
    Setting(
        "sampler.mode",
        "sampler_mode",
        "agent",
        settingparsers.choice(settingparsers.SAMPLER_MODES),
        "",
        "agent: one sampling process per host and session reads each GPU and the host once and every "
        "worker process, outside the workers' GIL; thread: each worker samples itself on a thread "
        "(processes=False clusters, or no agent wanted; device and host readings then once per worker)",
    ),
    Setting(
        "sampler.host-refresh",
        "host_refresh",
        200,
        settingparsers.number("a number of ms > 0"),
        "ms",
        "host counters are read on the samples nearest to every this many ms; samples in between "
        "repeat the last host reading (at most the polling interval: every sample)",
    ),
    Setting(
        "run.directory",
        "run_directory",
        None,
        settingparsers.run_directory,
        "",
        "where each host's workers and agent keep their session files (dask-influx-metrics-<uid>/ inside; a path "
        "of at most 40 bytes: the agent's socket is made there); null = /dev/shm (the temporary directory where "
        "there is none)",
    ),
    Setting(
        "run.outbox-budget",
        "outbox_budget",
        1 << 20,
        settingparsers.number("a number of bytes from 65536", minimum=1 << 16, integer=True),
        "bytes",
        "what each worker's outbox (its task stream and custom metrics, waiting for the agent) may hold in the "
        "run directory; beyond it, or when that is full, in the spool directory on disk",
    ),
    Setting(
        "accounting.interval",
        "accounting_interval",
        10,
        settingparsers.seconds,
        "s",
        "the per-job accounting totals (tracking name accounting) are written this often, at a job's end on "
        "the host and at the session's end, each point carrying the totals so far",
    ),
    Setting(
        "accounting.retention",
        "accounting_retention",
        300,
        settingparsers.seconds,
        "s",
        "a job's accounting rows stay (rewritten at every interval, and on the Prometheus endpoint) this long "
        "after it last ran on the host; then they are dropped (its totals are in the points written)",
    ),
    Setting(
        "prometheus.port",
        "prometheus_port",
        None,
        settingparsers.optional_port,
        "",
        "the host's sampling agent serves /metrics (Prometheus text format: per-job counters, per-GPU and "
        "per-worker gauges) on this TCP port; null = off. Needs prometheus_client (the prometheus extra)",
    ),
    Setting(
        "prometheus.address",
        "prometheus_address",
        "0.0.0.0",
        settingparsers.text,
        "",
        "the address the /metrics endpoint binds (0.0.0.0: every interface; 127.0.0.1: this machine only)",
    ),
)
