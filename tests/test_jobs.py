import pytest

from dask_influx_metrics.scheduler.jobs import JobBook


def test_client_mode_numbers_jobs_per_client_in_submission_order():
    book = JobBook("client")
    a1 = book.submit("Client-a", ["a1"], now=1)
    b1 = book.submit("Client-b", ["b1"], now=2)
    a2 = book.submit("Client-a", ["a2"], now=3)
    assert [(d.number, d.job) for d in (a1, b1, a2)] == [(1, 1), (2, 2), (3, 1)]
    assert book.jobs[1].dags == [1, 3] and book.jobs[2].label == "Client-b"


def test_submissions_from_inside_a_task_join_the_parent_job():
    book = JobBook("client")
    book.submit("Client-a", ["parent"], now=1)
    child = book.submit("Client-worker-123", ["child"], now=2, parent_job=1)
    assert child.job == 1 and set(book.jobs) == {1}


def test_manual_mode_changes_job_only_through_new_job():
    book = JobBook("manual")
    assert book.submit("Client-a", ["x"], now=1).job == 1
    assert book.submit("Client-b", ["y"], now=1).job == 1
    assert book.new_job() == 2
    assert book.new_job() == 2  # nothing submitted in between: no empty job
    assert book.submit("Client-a", ["z"], now=1).job == 2
    assert book.new_job(job=7) == 7
    assert book.submit("Client-a", ["w"], now=1).job == 7


def test_manual_jobs_label_their_dags():
    book = JobBook("manual")
    book.new_job(label="etl")
    first = book.submit("Client-a", ["x"], now=1.0)
    book.new_job()
    second = book.submit("Client-a", ["y"], now=2.0)
    assert (first.label, second.label) == ("etl", "Client-a")
    assert (book.jobs[1].label, book.jobs[2].label) == ("etl", "manual")
    with pytest.raises(ValueError, match="label must be a string"):
        book.new_job(label=3)


def test_first_new_job_before_any_submission_is_job_one():
    book = JobBook("manual")
    assert book.new_job() == 1


def test_new_job_refused_in_client_mode_and_for_bad_numbers():
    with pytest.raises(ValueError, match="manual"):
        JobBook("client").new_job()
    with pytest.raises(ValueError, match="positive integer"):
        JobBook("manual").new_job(0)
    with pytest.raises(ValueError, match="job_type"):
        JobBook("sometimes")


def test_dag_ends_when_all_its_tasks_finish_and_an_error_marks_it_erred():
    book = JobBook()
    dag = book.submit("c", ["x", "y", "z"], now=1)
    assert book.task_done("x", erred=False, now=2) is None
    assert book.task_done("y", erred=True, now=3) is None
    ended = book.task_done("z", erred=True, now=4)
    assert ended is dag and dag.status == "erred" and dag.ended == 4
    assert book.running_dags() == []


def test_keys_keep_their_first_owner_and_an_empty_submission_ends_at_once():
    book = JobBook()
    first = book.submit("c1", ["shared"], now=1)
    again = book.submit("c2", ["shared"], now=2)
    assert again.ntasks == 0 and again.status == "ok" and again.ended == 2
    assert book.owner("shared") is first


def test_summary_is_plain_data():
    book = JobBook()
    book.submit("c", ["x"], now=1)
    s = book.summary()
    assert s["dags"][1] == {"job": 1, "client": "c", "submitted": 1, "ended": None, "status": "running", "tasks": 1}


def test_tasks_forgotten_before_finishing_mark_the_dag_cancelled_not_ok():
    book = JobBook()
    dag = book.submit("c", ["x", "y", "z"], now=1)
    assert book.task_done("x", erred=False, now=2) is None
    assert book.task_done("y", cancelled=True, now=3) is None  # released and forgotten, never ran
    ended = book.task_done("z", cancelled=True, now=4)
    assert ended is dag and dag.status == "cancelled" and dag.ended == 4


def test_an_error_outranks_a_cancellation():
    book = JobBook()
    dag = book.submit("c", ["x", "y"], now=1)
    book.task_done("x", erred=True, now=2)
    book.task_done("y", cancelled=True, now=3)
    assert dag.status == "erred"
