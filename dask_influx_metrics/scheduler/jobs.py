"""Job and DAG bookkeeping, pure: no Dask in here, the scheduler plugin feeds it.

* A DAG is one graph submission (one compute/persist/submit batch). DAG
  numbers count from 1 in the order the scheduler receives submissions.
* A job is one client connection (``job_type="client"``), or whatever
  :meth:`JobBook.new_job` says (``job_type="manual"``): job 1 until the first
  ``new_job()`` after a submission, then 2, ...; ``new_job(job=N)`` sets N.
* A DAG's ``label`` is its manual job's label (``new_job(label=...)``), else the
  id of the client that submitted it.
  Graphs submitted from inside a task belong to that task's job.
* A DAG ends when every task it brought has reached memory, erred or been
  forgotten; its status is ``erred`` if any of them erred, else ``cancelled``
  if any was forgotten before it finished (futures cancelled or dropped, the
  client gone, ``client.restart()``), else ``ok``.

Example
-------
>>> book = JobBook("client")
>>> dag = book.submit("Client-a", ["x", "y"], now=10.0)
>>> (dag.number, dag.job), book.jobs[1].label
((1, 1), 'Client-a')
>>> book.task_done("x", erred=False) is None
True
>>> ended = book.task_done("y", erred=True)
>>> ended.number, ended.status
(1, 'erred')
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Job:
    number: int
    label: str
    dags: list[int] = field(default_factory=list)


@dataclass
class Dag:
    number: int
    job: int
    client: str
    submitted: float
    ntasks: int
    pending: set = field(default_factory=set, repr=False)
    ended: float | None = None
    status: str = "running"  # running, then ok, erred or cancelled
    label: str = ""  # its manual job's label, else the client's id


class JobBook:
    """Counts jobs and DAGs for one monitoring session."""

    def __init__(self, job_type: str = "client"):
        if job_type not in ("client", "manual"):
            raise ValueError(f"job_type must be 'client' or 'manual', got {job_type!r}")
        self.job_type = job_type
        self.jobs: dict[int, Job] = {}
        self.dags: dict[int, Dag] = {}
        self._client_job: dict[str, int] = {}
        self._key_dag: dict = {}
        self._manual_job = 1
        self._labels: dict[int, str] = {}  # manual jobs' labels, from new_job(label=...)

    def job_of_client(self, client: str, parent_job: int | None = None) -> int:
        """The job a submission from ``client`` belongs to (creating it)."""
        if parent_job:
            return parent_job
        if self.job_type == "manual":
            number = self._manual_job
            self.jobs.setdefault(number, Job(number, self._labels.get(number, "manual")))
            return number
        if client not in self._client_job:
            number = max(self.jobs, default=0) + 1
            self.jobs[number] = Job(number, client)
            self._client_job[client] = number
        return self._client_job[client]

    def new_job(self, job: int | None = None, label: str | None = None) -> int:
        """Manual mode: the next submissions belong to ``job`` (default: next), labelled ``label``."""
        if self.job_type != "manual":
            raise ValueError("new_job() needs job_type='manual'; this session counts jobs per client")
        if job is not None and (isinstance(job, bool) or not isinstance(job, int) or job < 1):
            raise ValueError(f"job must be a positive integer, got {job!r}")
        if label is not None and not isinstance(label, str):
            raise ValueError(f"label must be a string, got {label!r}")
        # Jobs exist only once they have a DAG, so repeated new_job() calls with
        # nothing submitted in between do not leave empty job numbers behind.
        self._manual_job = job if job is not None else max(self.jobs, default=0) + 1
        if label:
            self._labels[self._manual_job] = label
        return self._manual_job

    def submit(self, client: str, new_keys, now: float, parent_job: int | None = None) -> Dag:
        """Record one graph submission of ``new_keys`` (keys not seen before)."""
        job = self.job_of_client(client, parent_job)
        number = len(self.dags) + 1
        pending = {k for k in new_keys if k not in self._key_dag}
        dag = Dag(number, job, client, now, len(pending), pending, label=self._labels.get(job, client))
        self.dags[number] = dag
        self.jobs.setdefault(job, Job(job, client)).dags.append(number)
        for k in pending:
            self._key_dag[k] = number
        if not pending:
            self._end(dag, now)
        return dag

    def owner(self, key) -> Dag | None:
        """The DAG that brought ``key``, while it is pending."""
        number = self._key_dag.get(key)
        return self.dags.get(number) if number else None

    def task_done(self, key, erred: bool = False, now: float | None = None, cancelled: bool = False) -> Dag | None:
        """A task reached memory, erred, or was forgotten before finishing (``cancelled``);
        returns its DAG if that ended it. An error outranks a cancellation."""
        number = self._key_dag.pop(key, None)
        if number is None:
            return None
        dag = self.dags[number]
        dag.pending.discard(key)
        if erred:
            dag.status = "erred"
        elif cancelled and dag.status == "running":
            dag.status = "cancelled"
        if not dag.pending:
            self._end(dag, now if now is not None else dag.submitted)
            return dag
        return None

    def _end(self, dag: Dag, now: float) -> None:
        dag.ended = now
        if dag.status == "running":
            dag.status = "ok"

    def running_dags(self) -> list[int]:
        return [d.number for d in self.dags.values() if d.ended is None]

    def summary(self) -> dict:
        """Plain-data view for clients (picklable, no key sets)."""
        return {
            "job_type": self.job_type,
            "jobs": {n: {"label": j.label, "dags": list(j.dags)} for n, j in self.jobs.items()},
            "dags": {
                n: {
                    "job": d.job,
                    "client": d.client,
                    "submitted": d.submitted,
                    "ended": d.ended,
                    "status": d.status,
                    "tasks": d.ntasks,
                }
                for n, d in self.dags.items()
            },
        }
