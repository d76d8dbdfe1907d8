"""Experiment grids on a Dask cluster (``calmkit experiment FIGURE --scheduler ...``).

``scheduler`` is ``"local"`` (a :class:`dask.distributed.LocalCluster` of ``jobs``
one-thread worker processes on this machine) or the address of a running scheduler
(``tcp://host:8786``), whose workers have calmkit installed.

Each task runs :func:`~calmkit_simulator.tasks.run_task` on a worker, so results are
the same as with ``--jobs`` (a task's result depends only on the task). A population
is loaded here once and broadcast to every worker once (``Client.scatter``); tasks
take it by reference, and it is released when its last task ends. Classification
tasks load their data on the worker (``--data-dir`` must exist there too). At most
two tasks per worker thread are in flight, so an interruption loses little, and
results arrive as their futures complete (for progress and the cache).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from calmkit_client import CalmkitError

from .datasets import DatasetError
from .population import Population
from .tasks import Task, dataset_failure, load_population, run_task

if TYPE_CHECKING:
    from dask.distributed import Client, Future, LocalCluster

__all__ = ["connect", "run_on_cluster"]

LOCAL = "local"


def connect(scheduler: str, jobs: int) -> tuple[Client, LocalCluster | None]:
    """A client of ``scheduler`` (and the cluster it started, for ``"local"``)."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise CalmkitError(
            "scheduler needs dask.distributed: pip install 'calmkit[simulator]'"
        ) from None
    if scheduler == LOCAL:
        import dask

        # the workers' statistical profiler samples every thread's stack every 10 ms;
        # tasks here are long numpy work, so it is only overhead (the nannies hand this
        # configuration to the worker processes)
        with dask.config.set({"distributed.worker.profile.enabled": False}):
            cluster = LocalCluster(
                n_workers=jobs, threads_per_worker=1, processes=True, dashboard_address=":0"
            )
        return Client(cluster), cluster
    if "://" not in scheduler:
        raise CalmkitError(
            f"scheduler ({scheduler!r}) must be 'local' or an address like tcp://host:8786"
        )
    try:
        return Client(scheduler, timeout="10s"), None
    except OSError as exc:
        raise CalmkitError(f"scheduler ({scheduler!r}) is not reachable: {exc}") from None


def run_on_cluster(
    todo: list[Task],
    scheduler: str,
    jobs: int,
    data_dir: str | None,
    finished: Callable[[Task, dict[str, Any]], None],
) -> None:
    """Run ``todo`` on the cluster; ``finished(task, result)`` as each one ends."""
    from dask.distributed import as_completed

    client, cluster = connect(scheduler, jobs)
    try:
        slots = 2 * max(1, sum(client.nthreads().values()))
        left = Counter(t.population_key() for t in todo if t.kind != "classify")
        shipped: dict[tuple[Any, ...], Future[Population]] = {}
        pending: dict[Future[dict[str, Any]], Task] = {}
        running = as_completed()
        queue = list(reversed(todo))

        def submit(task: Task) -> None:
            if task.kind == "classify":
                future = client.submit(run_task, task, data_dir, pure=False)
            else:
                key = task.population_key()
                if key not in shipped:
                    try:
                        population = load_population(task, data_dir)
                    except DatasetError as exc:
                        _done(task, dataset_failure(exc))
                        return
                    shipped[key] = client.scatter(population, broadcast=True, hash=False)
                future = client.submit(run_task, task, data_dir, shipped[key], pure=False)
            pending[future] = task
            running.add(future)

        def _done(task: Task, result: dict[str, Any]) -> None:
            finished(task, result)
            if task.kind != "classify":
                key = task.population_key()
                left[key] -= 1
                if left[key] == 0:  # its last task: the workers may drop it
                    shipped.pop(key, None)

        def fill() -> None:
            while queue and len(pending) < slots:
                submit(queue.pop())

        fill()
        for future in running:
            task = pending.pop(future)
            _done(task, future.result())
            fill()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
