"""Experiment grids: the on-disk result cache and the runner of many :class:`~.tasks.Task`
(one point of a figure each; a task's result depends only on the task, :mod:`.tasks`).

The :class:`ResultCache` (SQLite, one row per finished task, committed at once) lets an
interrupted grid resume where it stopped; tasks run in this process, in worker
processes or on a Dask cluster (:mod:`.cluster`), with the same results.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from calmkit_client import CalmkitError

from .tasks import Task, run_task

__all__ = ["ResultCache", "run_tasks"]


class ResultCache:
    """Finished tasks on disk: ``key -> (task, result)`` in SQLite, committed per task."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS results "
            "(key TEXT PRIMARY KEY, task TEXT NOT NULL, result TEXT NOT NULL)"
        )
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS runs (figure TEXT NOT NULL, command TEXT NOT NULL, "
            "computed INTEGER NOT NULL, seconds REAL NOT NULL, jobs INTEGER NOT NULL, "
            "at TEXT NOT NULL)"
        )
        self._db.commit()

    def get(self, task: Task) -> dict[str, Any] | None:
        row = self._db.execute("SELECT result FROM results WHERE key = ?", (task.key(),)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def keys(self) -> set[str]:
        """The keys of every finished task (one query)."""
        return {row[0] for row in self._db.execute("SELECT key FROM results")}

    def put(self, task: Task, result: dict[str, Any]) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO results VALUES (?, ?, ?)",
            (task.key(), json.dumps(asdict(task), default=str), json.dumps(result)),
        )
        self._db.commit()

    def log_run(self, figure: str, command: str, computed: int, seconds: float, jobs: int) -> None:
        """Record one run's wall time and how many tasks it computed (not cached)."""
        at = time.strftime("%Y-%m-%d %H:%M:%S")
        self._db.execute(
            "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?)",
            (figure, command, computed, seconds, jobs, at),
        )
        self._db.commit()

    def runs(self, figure: str) -> list[dict[str, Any]]:
        """The runs of ``figure`` that computed at least one task, oldest first."""
        rows = self._db.execute(
            "SELECT command, computed, seconds, jobs, at FROM runs "
            "WHERE figure = ? AND computed > 0 ORDER BY rowid",
            (figure,),
        ).fetchall()
        keys = ("command", "computed", "seconds", "jobs", "at")
        return [{**dict(zip(keys, row)), "command": shown_command(row[0])} for row in rows]

    def close(self) -> None:
        self._db.close()


# Options whose values are folders of the machine that ran: a report shows them as DIR.
_PATH_OPTIONS = ("--out", "--data-dir")


def shown_command(command: str) -> str:
    """``command`` as a report shows it: the values of the path options as ``DIR`` (one
    machine's folders mean nothing to the report's reader)."""
    words = command.split(" ")
    shown = []
    for i, word in enumerate(words):
        option = word.split("=", 1)[0]
        if i and words[i - 1] in _PATH_OPTIONS:
            shown.append("DIR")
        elif option in _PATH_OPTIONS and "=" in word:
            shown.append(f"{option}=DIR")
        else:
            shown.append(word)
    return " ".join(shown)


def _run_in_worker(task: Task, data_dir: str | None) -> dict[str, Any]:
    return run_task(task, data_dir)


def _one_blas_thread() -> None:
    """Worker initialiser: one BLAS/OpenMP thread per worker process, as Dask's workers
    run. With ``jobs`` processes on ``jobs`` cores, threaded BLAS in every process
    oversubscribes the cores and its idle threads spin."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)


# -- the runner -----------------------------------------------------------------------
def run_tasks(
    tasks: Iterable[Task],
    cache: ResultCache,
    data_dir: Path | str | None = None,
    jobs: int = 1,
    progress: Callable[[int], None] | None = None,
    scheduler: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Every task's result, from ``cache`` or computed (and cached at once).

    ``jobs > 1`` runs tasks in that many worker processes; ``scheduler`` on a Dask
    cluster instead (``"local"``: ``jobs`` local workers; see :mod:`.cluster`).
    Results are the same either way. An interruption loses at most the tasks in flight.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise CalmkitError(f"jobs ({jobs!r}) must be an int >= 1")
    unique = {t.key(): t for t in tasks}
    results: dict[str, dict[str, Any]] = {}
    todo: list[Task] = []
    for key, task in unique.items():
        hit = cache.get(task)
        if hit is not None:
            results[key] = hit
            if progress is not None:
                progress(1)
        else:
            todo.append(task)
    # populations together, so each worker's memo is reused
    todo.sort(key=lambda t: (str(t.population_key()), t.query_k, t.mechanism, t.epsilon))
    where = None if data_dir is None else str(data_dir)
    if scheduler is not None and todo:
        from .cluster import run_on_cluster

        def finished(task: Task, result: dict[str, Any]) -> None:
            results[task.key()] = _finish(cache, task, result, progress)

        run_on_cluster(todo, scheduler, jobs, where, finished)
        return results
    if jobs == 1 or len(todo) <= 1:
        for task in todo:
            results[task.key()] = _finish(cache, task, run_task(task, where), progress)
        return results
    workers = min(jobs, os.cpu_count() or 1, len(todo))
    with ProcessPoolExecutor(max_workers=workers, initializer=_one_blas_thread) as pool:
        pending: dict[Future[dict[str, Any]], Task] = {}
        queue = list(reversed(todo))
        while queue or pending:
            while queue and len(pending) < 2 * jobs:  # bounded queue: stop fast on ^C
                task = queue.pop()
                pending[pool.submit(_run_in_worker, task, where)] = task
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                task = pending.pop(fut)
                results[task.key()] = _finish(cache, task, fut.result(), progress)
    return results


def _finish(
    cache: ResultCache,
    task: Task,
    result: dict[str, Any],
    progress: Callable[[int], None] | None,
) -> dict[str, Any]:
    if result["status"] != "missing_data":  # a dataset may appear later: do not cache
        cache.put(task, result)
    if progress is not None:
        progress(1)
    return result


def summarize(task: Task, result: dict[str, Any]) -> dict[str, Any]:
    """One CSV row: the task's fields, mean/sd of the metric, runtime, status."""
    row: dict[str, Any] = {k: v for k, v in asdict(task).items() if k != "options"}
    row["options"] = ";".join(f"{k}={v}" for k, v in task.options)
    row["status"] = result["status"]
    row["message"] = result.get("message", "")
    row["label"] = result.get("mechanism", task.mechanism)
    metric = "error" if task.kind == "classify" else "sse"
    values = np.asarray(result.get(metric, []), dtype=float)
    row["mean"] = float(values.mean()) if values.size else float("nan")
    row["std"] = (
        float(values.std(ddof=1)) if values.size > 1 else 0.0 if values.size else float("nan")
    )
    for extra in ("uniform", "nonoise", "majority"):
        vals = result.get(extra)
        row[extra] = float(np.mean(vals)) if vals else float("nan")
    secs = result.get("seconds") or []
    row["seconds_per_rep"] = float(np.median(secs)) if secs else float("nan")
    chosen = result.get("chosen") or {}
    row["m"], row["l"] = chosen.get("m", ""), chosen.get("l", "")
    row["mechanism_seed"] = result.get("mechanism_seed", task.mechanism_seed())
    row["privacy_unit"] = result.get("privacy_unit", "")
    return row


def task_rows(tasks: Sequence[Task], results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [summarize(t, results[t.key()]) for t in tasks if t.key() in results]
