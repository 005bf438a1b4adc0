"""The command line's shared options and how ``--source`` is opened (see :mod:`.cli`)."""

from __future__ import annotations

import contextlib
import functools
import json
import logging

import click

SOURCE_ENV = "DASK_INFLUX_METRICS_SOURCE"


class Group(click.Group):
    """A group that turns expected errors into ``error: <message>`` and exit status 2."""

    def invoke(self, ctx):
        from .query.base import QueryError

        try:
            return super().invoke(ctx)
        except (QueryError, ValueError, OSError, ImportError) as e:
            click.echo("error: " + " ".join(str(e).split("\n")), err=True)
            raise click.exceptions.Exit(2) from None


def _comma(numbers: bool = False):
    """A callback: ``a,b`` -> ``["a", "b"]`` (digits -> ints when ``numbers``); None stays None."""

    def split(ctx, param, value):
        items = None if value is None else [v.strip() for v in value.split(",") if v.strip()]
        if items == []:
            raise click.BadParameter(f"{value!r} names nothing", ctx, param)
        return items and [int(v) if numbers and v.isdigit() else v for v in items]

    return split


def _time(ctx, param, value):
    """A callback: epoch seconds (a number) or an ISO time, checked now."""
    from .query import to_ns

    try:
        value = float(value) if value is not None else None
    except ValueError:
        pass
    try:
        to_ns(value)
    except (ValueError, TypeError) as e:
        raise click.BadParameter(str(e), ctx, param) from None
    return value


def _tags(ctx, param, values) -> dict:
    out = {}
    for item in values:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", ctx, param)
        out[key] = value
    return out


def default_source() -> str:
    """Where this machine's settings put samples: the spool root when the ``spool`` sink is on
    (``sink: auto`` with neither telegraf.address nor influxdb.url configured), else InfluxDB."""
    from ..config import Settings

    settings = Settings.resolve()
    return settings.spool_directory if "spool" in settings.sinks else settings.influxdb_url


SCHEDULER_SCHEMES = ("tcp://", "tls://", "ucx://", "inproc://", "ws://", "wss://")


@contextlib.contextmanager
def _from_scheduler(address: str, **options):
    """The Store of the session a cluster's monitor ran last, read from where its workers sent it."""
    from distributed import Client

    from .monitor import Monitor

    with Client(address, timeout=30) as client:
        monitor = Monitor(client)
        try:
            yield monitor.query(**{k: v for k, v in options.items() if v is not None})
        finally:
            monitor._close_store()


_STORE_OPTIONS = {  # parameter name -> its option
    "source": click.option(
        "--source",
        envvar=SOURCE_ENV,
        metavar="URL|DIR",
        help=f"InfluxDB URL (http[s]://host:8086), spool folder, or a Dask scheduler address "
        "(tcp://host:8786: the monitor's last session, read where its workers sent it). "
        f"Default: ${SOURCE_ENV}, else "
        "the configured spool.directory when the 'spool' sink is on, else influxdb.url "
        "(Dask config influx-metrics.*).",
    ),
    "database": click.option(
        "--database",
        metavar="NAME",
        help="InfluxDB database (a bucket for Flux, e.g. "
        "dask_metrics/autogen). Default: influx-metrics.influxdb.database, i.e. dask_metrics.",
    ),
    "language": click.option(
        "--language",
        type=click.Choice(["influxql", "flux"]),
        default="influxql",
        show_default=True,
        help="Query language for a URL source (flux needs influxdb-client).",
    ),
    "session": click.option(
        "--session",
        metavar="ID|N|all",
        help="The monitoring session to read: its id, N (1 = the latest, 2 = the one before: see `sessions`) or "
        "all. Default: the latest in the time range and tags (a note names it when there are others).",
    ),
    "tags": click.option(
        "--tag",
        "tags",
        multiple=True,
        callback=_tags,
        metavar="KEY=VALUE",
        help="Read only points with this tag, e.g. --tag run=nightly (repeatable).",
    ),
    "start": click.option(
        "--start", callback=_time, metavar="TIME", help="Read samples from this time on: ISO time or epoch seconds."
    ),
    "stop": click.option(
        "--stop", callback=_time, metavar="TIME", help="Read samples before this time: ISO time or epoch seconds."
    ),
    "retention_policy": click.option(
        "--retention-policy", metavar="RP", help="InfluxQL retention policy (default: the database's)."
    ),
    "username": click.option("--username", help="InfluxDB user (default: influx-metrics.influxdb.username)."),
    "password": click.option("--password", help="InfluxDB password (default: influx-metrics.influxdb.password)."),
    "token": click.option("--token", help="InfluxDB 2.x/3.x token (default: influx-metrics.influxdb.token)."),
    "org": click.option("--org", help="InfluxDB 2.x organization (Flux only)."),
    "timeout": click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds per HTTP request."),
}
# What a command that writes into InfluxDB takes of them (replay): where to, and how to log in.
_INFLUXDB_KEYS = ("source", "database", "retention_policy", "username", "password", "token", "timeout")


def _configured(database=None, username=None, password=None, token=None, retention_policy=None) -> dict:
    """These options, each from the Dask config (``influx-metrics.influxdb.*``) where not given."""
    import dask

    def conf(key, given):
        return given if given is not None else dask.config.get(f"influx-metrics.influxdb.{key}", default=None)

    return {
        "database": conf("database", database) or "dask_metrics",
        "username": conf("username", username),
        "password": conf("password", password),
        "token": conf("token", token),
        "retention_policy": conf("retention-policy", retention_policy),
    }


def _connect(source=None, database=None, username=None, password=None, token=None, retention_policy=None, **kw):
    from . import query

    if source and source.startswith(SCHEDULER_SCHEMES):
        return _from_scheduler(
            source,
            database=database,
            username=username,
            password=password,
            token=token,
            retention_policy=retention_policy,
            **kw,
        )
    login = _configured(database, username, password, token, retention_policy)
    return query.connect(source or default_source(), login.pop("database"), **login, **kw)


@contextlib.contextmanager
def _notes_only():
    """The spool reader logs each note it keeps (which session it picked, corrupt lines): the command
    prints the notes (``note: ...``), so the log's copies would say everything twice."""
    from .query import spool

    log = logging.getLogger(spool.__name__)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def store_options(f):
    """Add the connection options; the command gets ``open_store()`` (a callable) as its first argument.

    The Store it opens is closed when the command returns (``with query.connect(...) as db:``).
    Put it directly above the ``def`` so these options come last in ``--help``.
    """

    @functools.wraps(f)
    def command(**kw):
        given, stores = {k: kw.pop(k) for k in _STORE_OPTIONS}, []
        with contextlib.ExitStack() as opened:
            opened.enter_context(_notes_only())
            try:
                return f(lambda: stores.append(opened.enter_context(_connect(**given))) or stores[-1], **kw)
            finally:  # what the answers should be read with: skipped lines, undelivered samples
                for note in (n for db in stores for n in db.notes):
                    click.echo(f"note: {note}", err=True)

    for option in reversed(_STORE_OPTIONS.values()):
        command = option(command)
    return command


_WRITE_SOURCE = click.option(
    "--source",
    envvar=SOURCE_ENV,
    metavar="URL",
    help=f"The InfluxDB to write into (http[s]://host:8086). Default: ${SOURCE_ENV}, else influx-metrics.influxdb.url.",
)


def influxdb_options(f):
    """Add the options that name an InfluxDB and log in to it (a command that writes: replay); the command
    gets ``source`` and ``database``, each from the config where not given, and ``options``, the sink's
    :class:`~dask_influx_metrics.sinks.http.HttpOptions`."""

    @functools.wraps(f)
    def command(**kw):
        from ..config import Settings
        from ..sinks.http import HttpOptions

        given = {k: kw.pop(k) for k in _INFLUXDB_KEYS}
        source, timeout = given.pop("source") or Settings.resolve().influxdb_url, given.pop("timeout")
        login = _configured(**given)
        return f(source=source, database=login.pop("database"), options=HttpOptions(**login, timeout=timeout), **kw)

    for option in reversed([_WRITE_SOURCE] + [_STORE_OPTIONS[k] for k in _INFLUXDB_KEYS[1:]]):
        command = option(command)
    return command


# Options shared by several commands (click makes a fresh Option each time one is applied).
format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
    help="Output: an aligned table, CSV, or JSON.",
)
workers_option = click.option(  # --worker, as plot's single one: one spelling everywhere
    "--worker",
    "workers",
    callback=_comma(numbers=True),
    metavar="I,J|ADDR",
    help="Workers by index (see `workers`) or address, comma separated [default: all].",
)
job_option = click.option("--job", type=int, metavar="N", help="Only samples of job N (see `jobs`).")
metrics_option = click.option(
    "--metrics",
    callback=_comma(),
    metavar="A,B",
    help="Metric names, comma separated (see `metrics`) [default: all collected].",
)
per_job_option = click.option(
    "--per-job/--whole", default=True, show_default=True, help="One row per job, or one over the whole session."
)


def found(db, answer, what: str):
    """``answer``, or an error saying what was not found where (instead of printing nothing)."""
    if len(answer) == 0:
        from .query.base import QueryError

        raise QueryError(db.not_found(what))
    return answer


def emit(data, fmt: str, column: str = "value") -> None:
    """Print a DataFrame or a list as a table (``to_string(index=False)``), CSV or JSON."""
    import pandas as pd

    if not isinstance(data, pd.DataFrame):
        if fmt == "json":
            return click.echo(json.dumps(data))
        if fmt == "table":
            return click.echo("\n".join(map(str, data)), nl=bool(data))
        data = pd.DataFrame({column: data})
    if fmt == "json":
        click.echo(data.to_json(orient="records", date_format="iso"))
    elif fmt == "csv":
        click.echo(data.to_csv(index=False), nl=False)
    else:
        click.echo("(no rows)" if data.empty else data.to_string(index=False))
