"""Experiment grids on a real Dask cluster: the same results as worker processes,
populations shipped to the workers (never loaded there), missing data reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from calmkit_client import CalmkitError, cli
from calmkit_simulator.figures import build_figure
from calmkit_simulator.grid import ResultCache, run_tasks
from calmkit_simulator.tasks import Task

distributed = pytest.importorskip("dask.distributed", reason="dask[distributed] is not installed")


def _strip(result: dict[str, Any]) -> dict[str, Any]:
    return dict(result, seconds=None)  # wall times differ; everything else must not


def _memo_size() -> int:
    from calmkit_simulator.tasks import _MEMO

    return len(_MEMO.populations)


@pytest.fixture(scope="module")
def cluster() -> Any:
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as c:
        yield c


def test_cluster_results_equal_worker_processes(tmp_path: Path, cluster: Any) -> None:
    tasks = build_figure("fig9", quick=True, dataset="synthetic").tasks()
    missing = Task(dataset="kosarak", mechanism="calm", epsilon=1.0, k=3, query_k=3, reps=1)
    tasks.append(missing)
    where = tmp_path / "no-data"
    pool = run_tasks(tasks, ResultCache(tmp_path / "a.sqlite"), where, jobs=2)
    done: list[int] = []
    dask = run_tasks(
        tasks,
        ResultCache(tmp_path / "b.sqlite"),
        where,
        jobs=2,
        progress=done.append,
        scheduler=cluster.scheduler_address,
    )
    assert len(done) == len({t.key() for t in tasks})  # progress per finished future
    assert pool.keys() == dask.keys()
    for key in pool:
        assert _strip(pool[key]) == _strip(dask[key])
    assert dask[missing.key()]["status"] == "missing_data"
    assert sum(r["status"] == "ok" for r in dask.values()) == len(dask) - 1
    # the workers were given the populations: none loaded one itself
    with distributed.Client(cluster.scheduler_address) as client:
        assert set(client.run(_memo_size).values()) == {0}


def test_experiment_on_a_local_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["experiment", "fig8", "--quick", "--dataset", "synthetic", "--no-plot", "--json"]
    assert cli.main([*base, "--out", str(tmp_path / "a"), "--jobs", "1"]) == 0
    capsys.readouterr()
    argv = [*base, "--out", str(tmp_path / "b"), "--jobs", "2", "--scheduler", "local"]
    assert cli.main(argv) == 0
    assert '"status": {"ok":' in capsys.readouterr().out
    a = (tmp_path / "a" / "data" / "fig8.csv").read_text().splitlines()
    b = (tmp_path / "b" / "data" / "fig8.csv").read_text().splitlines()
    header = a[0].split(",")
    timing = header.index("seconds_per_rep")

    def rows(lines: list[str]) -> list[list[str]]:
        return [r[:timing] + r[timing + 1 :] for r in (line.split(",") for line in lines)]

    assert rows(a) == rows(b)


def test_bad_scheduler_address_is_refused() -> None:
    tasks = [Task(dataset="synthetic", mechanism="uni", epsilon=1.0, k=2, query_k=2, reps=1)]
    with pytest.raises(CalmkitError, match=r"scheduler \('nowhere'\) must be 'local' or an"):
        run_tasks(tasks, ResultCache(":memory:"), scheduler="nowhere")
