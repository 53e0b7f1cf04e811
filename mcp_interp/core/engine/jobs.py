"""The long-job contract, written once: a job is a generator of steps plus a result.

Long work (patching every head, ``explain``, the swap benchmark, fitting a lens) is written as
a job rather than a function so that the server can

* report progress: ``total_steps()`` is known up front and each step yields a message;
* stop on cancellation: the step in flight is interrupted at its next transformer block
  (``core.engine.backend.interrupt``) and the generator closed, so the model is free again at once;
* share the model: other callers' work runs between steps (``host.run_steps``), so a step
  should take seconds, not minutes — and progress should move at least every 10 s — which is
  why long loops yield inside (a bisection step yields per chunk of pairs, ``Progress`` saying
  how far it is). Between steps the model must be at rest (``Backend.at_rest``): a mode a stage
  needs (edge points, frozen weights, inference mode) is entered per step (``per_step``), never
  held across a yield — a step that returns inside one keeps the model until it leaves it;
* run each step, and close the generator on cancellation, on the model thread: a step may
  enter thread-local state (``torch.inference_mode()``) that must be exited on the thread that
  entered it;
* keep what it measured when it is cancelled: ``partial()`` (optional) describes the best
  result so far, which a cancelled background job keeps in its record.

Scripts and tests that want the result without any of that call ``drain(job)``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol, TypeVar

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
Y = TypeVar("Y")


class Progress(NamedTuple):
    """A step's message with where the job stands (``done`` of ``total`` steps, fractions allowed), for steps that
    split a long stage into chunks whose count is known only once the stage starts."""

    message: str
    done: float
    total: float | None


class Pause:
    """A step that says nothing new: a point, inside a stage of many short runs, where the job gives the model to
    whoever waits (``host.run_steps``) without a progress message. Yield ``PAUSE`` between the runs of a loop whose
    messages come seconds apart, so others wait one run rather than the whole stretch."""

    def __repr__(self) -> str:
        return "PAUSE"


PAUSE = Pause()


def partial_of(job: Any) -> dict[str, Any] | None:
    """A job's best result so far (its ``partial()``, when it has one), or None; never raises (it is read while a
    cancelled job winds down)."""
    describe = getattr(job, "partial", None)
    if describe is None:
        return None
    try:
        found = describe()
    except Exception:
        return None
    return found if isinstance(found, dict) else None


class Job(Protocol[R_co]):
    """A long job: ``steps()`` does the work; afterwards ``result`` holds what it measured."""

    def total_steps(self) -> int:
        """How many messages ``steps()`` will yield (for progress totals; may be computed before any work)."""
        ...

    def steps(self) -> Iterator[str | Progress | Pause]:
        """Do the work, yielding one progress message per step (a ``Progress`` when a step says how far it is within a
        stage, ``PAUSE`` where it only gives others the model); fills ``result`` when exhausted.

        Closing the generator early (``.close()``) abandons the job cleanly at that step boundary.
        """
        ...

    @property
    def result(self) -> R_co | None:
        """None until ``steps()`` has run to the end."""
        ...


def per_step(enter: Callable[[], AbstractContextManager[Any]], steps: Generator[Y, None, R]) -> Generator[Y, None, R]:
    """``steps`` run with ``enter()`` (a mode of the model: ``backend.edge_points``, ``backend.weights_frozen``)
    entered around each of its steps and left at each yield, so the model is at rest between steps and other callers'
    work may run there (``host.run_steps``); returns what ``steps`` returns. Closing it closes ``steps``."""
    try:
        while True:
            with enter():
                try:
                    message = next(steps)
                except StopIteration as finished:
                    return finished.value
            yield message
    finally:
        steps.close()


def drain(job: Job[R]) -> R:
    """Run every step of ``job`` here, synchronously, and return its result."""
    for _ in job.steps():
        pass
    result = job.result
    if result is None:
        raise RuntimeError(f"{type(job).__name__} finished its steps without a result")
    return result
