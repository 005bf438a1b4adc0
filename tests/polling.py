"""Poll with a deadline instead of sleeping a fixed time."""

import time


def wait_until(predicate, timeout: float = 10.0, what: str = "condition", step: float = 0.01) -> None:
    """Return once ``predicate()`` is true; ``AssertionError`` naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout} s")
        time.sleep(step)
