"""The long-job contract, written once: a job is a generator of steps plus a result.

Long work (patching every head, ``explain``, the swap benchmark, fitting a lens) is written as
a job rather than a function so that the server can

* report progress: ``total_steps()`` is known up front and each step yields a message;
* stop on cancellation between steps: torch cannot be interrupted mid-call, so a cancelled
  request takes effect at the next step boundary and the model is free again at once;
* run each step, and close the generator on cancellation, on the model thread: a step may
  enter thread-local state (``torch.inference_mode()``) that must be exited on the thread that
  entered it (see ``Session.run_steps``).

Scripts and tests that want the result without any of that call ``drain(job)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, TypeVar

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Job(Protocol[R_co]):
    """A long job: ``steps()`` does the work; afterwards ``result`` holds what it measured."""

    def total_steps(self) -> int:
        """How many messages ``steps()`` will yield (for progress totals; may be computed before any work)."""
        ...

    def steps(self) -> Iterator[str]:
        """Do the work, yielding one progress message per step; fills ``result`` when exhausted.

        Closing the generator early (``.close()``) abandons the job cleanly at that step boundary.
        """
        ...

    @property
    def result(self) -> R_co | None:
        """None until ``steps()`` has run to the end."""
        ...


def drain(job: Job[R]) -> R:
    """Run every step of ``job`` here, synchronously, and return its result."""
    for _ in job.steps():
        pass
    result = job.result
    if result is None:
        raise RuntimeError(f"{type(job).__name__} finished its steps without a result")
    return result
