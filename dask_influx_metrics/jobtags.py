"""The ``job``/``dag`` tag rule, written once: every writer and reader uses these functions.

A sample's ``job`` and ``dag`` tags list the jobs/DAGs of the tasks executing
at that instant, ascending and comma-joined (``"2"``, ``"1,2"``). An idle
sample has ``dag="0"`` and the worker's last job (``"0"`` before its first
task): number 0 means "none", it is never a job or DAG of its own.

A sample **counts for job n** only when it is busy (``dag != "0"``) and its
``job`` tag lists n: idle samples count for no job, whatever job they carry.
Per-job peaks, summaries and plots all use this rule (:func:`counts_for`;
:data:`INFLUXQL_BUSY` and :data:`FLUX_BUSY` say the same on the server).

CSV files the older dask-metrics tool wrote are the one exception
(:class:`Rule`): their ``dag`` column is unreliable (it lagged behind the work),
so every row of a job counts for it, as that tool counted. A table names its
rule in ``table.attrs["job_rule"]``; absent means ours.

>>> tag = format([2, 1, 2])
>>> tag, parse(tag), contains(tag, 2), contains(tag, 12)
('1,2', (1, 2), True, False)
>>> influxql_regex(2)
'/(^|,)2(,|$)/'
"""

from __future__ import annotations

import enum
import operator
import re

_VARIABLE = re.compile(r"\$\w+")


def format(numbers, idle: int = 0) -> str:  # noqa: A001 (the codec's verb; the builtin is not used here)
    """The tag of ``numbers``: ascending, each once, 0 and None left out; ``str(idle)`` when none remain.

    >>> format([3, 1, 3, 0, None])
    '1,3'
    >>> format([]), format([], idle=2)
    ('0', '2')
    """
    nums = sorted({n for n in numbers if n})  # a few distinct numbers, however many tasks run
    return ",".join(str(_number(n)) for n in nums) if nums else str(_number(idle))


def parse(tag) -> tuple[int, ...]:
    """The numbers in a tag, as written (``"0"`` -> ``(0,)``); tokens that are not numbers are skipped.

    >>> parse("2,10"), parse("0"), parse(""), parse(7)
    ((2, 10), (0,), (), (7,))
    """
    return tuple(int(t) for t in str(tag).split(",") if t.strip().isdecimal())


def contains(tag, n: int) -> bool:
    """Whether the tag lists ``n`` (``"1,2"`` contains 2, ``"12"`` does not).

    >>> contains("1,2", 2), contains("12", 2), contains("0", 0)
    (True, False, True)
    """
    return _number(n) in parse(tag)


def distinct(tags, zero: bool = False) -> list[int]:
    """Every number in a collection of tags, ascending; 0 ("none") only with ``zero=True``.

    >>> distinct(["1", "1,2", "0", "3,2"]), distinct(["0", "2"], zero=True)
    ([1, 2, 3], [0, 2])
    """
    return sorted({n for tag in set(tags) for n in parse(tag) if n or zero})


def series_contains(tags, n: int):
    """Boolean mask of a pandas Series of tags: which list ``n`` (vectorised).

    >>> import pandas as pd
    >>> series_contains(pd.Series(["1", "1,2", "12"]), 2).tolist()
    [False, True, False]
    """
    return tags.astype(str).str.contains(rf"(?:^|,){_number(n)}(?:,|$)", regex=True)


IDLE = "0"  # the dag tag of an idle sample
INFLUXQL_BUSY = "\"dag\" != '0'"  # InfluxQL condition: busy samples only
FLUX_BUSY = 'r.dag != "0"'  # the same in Flux


def busy(dags):
    """Boolean mask of a pandas Series of ``dag`` tags: which samples are busy (``dag != "0"``).

    >>> import pandas as pd
    >>> busy(pd.Series(["0", "3", "1,2"])).tolist()
    [False, True, True]
    """
    return dags.astype(str) != IDLE


class Rule(str, enum.Enum):
    """Which rows of a table count for the jobs in their ``job`` tag."""

    BUSY = "busy"  # ours: busy samples only (dag != "0")
    EVERY_ROW = "every-row"  # the old dask-metrics tool's CSVs: every row of the job, as it counted


RULE = "job_rule"  # the DataFrame.attrs key naming a table's Rule


def counting(frame):
    """Boolean mask of a frame's rows that count for the jobs in their tag, by the frame's :class:`Rule`.

    >>> import pandas as pd
    >>> t = pd.DataFrame({"job": ["1", "1"], "dag": ["1", "0"]})
    >>> counting(t).tolist()
    [True, False]
    >>> t.attrs[RULE] = Rule.EVERY_ROW
    >>> counting(t).tolist()
    [True, True]
    """
    if Rule(frame.attrs.get(RULE, Rule.BUSY)) is Rule.EVERY_ROW:
        import pandas as pd

        return pd.Series(True, index=frame.index)
    return busy(frame["dag"])


def counts_for(frame, n: int):
    """Boolean mask of a frame's rows (``job`` and ``dag`` columns) that count for job ``n``: ``n`` in ``job``,
    and busy unless the frame's :class:`Rule` counts every row.

    >>> import pandas as pd
    >>> counts_for(pd.DataFrame({"job": ["1", "1", "1,2"], "dag": ["1", "0", "2,3"]}), 1).tolist()
    [True, False, True]
    """
    return counting(frame) & series_contains(frame["job"], n)


def explode(frame, column: str = "job", zero: bool = False):
    """One row per number in ``frame[column]`` (``"1,2"`` -> a row for 1 and one for 2, as ints).

    Rows whose tag holds no number, and (unless ``zero``) number 0, are dropped.

    >>> import pandas as pd
    >>> explode(pd.DataFrame({"job": ["1,2", "0", "3"], "x": [5, 6, 7]})).values.tolist()
    [[1, 5], [2, 5], [3, 7]]
    """
    tokens = frame[column].astype(str).str.split(",")
    out = frame.assign(**{column: tokens}).explode(column)
    out = out[out[column].str.strip().str.fullmatch(r"\d+")]
    out = out.assign(**{column: out[column].astype(int)})
    return out if zero else out[out[column] > 0]


def influxql_regex(n) -> str:
    """The InfluxQL regex literal that matches tags listing ``n``: ``"job" =~ /(^|,)2(,|$)/``.

    ``n`` is a number, or a Grafana template variable such as ``"$job"``.

    >>> influxql_regex(2), influxql_regex("$dag")
    ('/(^|,)2(,|$)/', '/(^|,)$dag(,|$)/')
    """
    token = n if isinstance(n, str) and _VARIABLE.fullmatch(n) else _number(n)
    return f"/(^|,){token}(,|$)/"


def flux_regex(n) -> str:
    """The Flux regex literal for tags listing ``n`` (Flux writes regexes like InfluxQL): ``r.job =~ /(^|,)2(,|$)/``.

    >>> flux_regex(2)
    '/(^|,)2(,|$)/'
    """
    return influxql_regex(n)


def _number(n) -> int:
    """A job/DAG number: a non-negative integer (numpy integers too), else a ``ValueError`` naming it."""
    try:
        if isinstance(n, bool):
            raise TypeError
        value = operator.index(n)
    except TypeError:
        raise ValueError(f"a job/DAG number is a non-negative integer, got {n!r}") from None
    if value < 0:
        raise ValueError(f"a job/DAG number is a non-negative integer, got {n!r}")
    return value
