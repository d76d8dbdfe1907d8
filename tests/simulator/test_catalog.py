"""``calmkit datasets``: every pinned digest is the real one, fetch verifies and
unpacks over HTTP (a local server stands in for the official sources), refuses a
mismatch leaving nothing behind, and missing data gets advice that fits."""

from __future__ import annotations

import functools
import gzip
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from calmkit_client.cli import main
from calmkit_simulator import catalog
from calmkit_simulator.catalog import CATALOG, Download, Source, fetch, sha256_of
from calmkit_simulator.datasets import DatasetError, load_dataset


@pytest.fixture
def http_folder(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """(folder, URL) of a local HTTP server serving that folder."""
    folder = tmp_path / "www"
    folder.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}/files"
    server.shutdown()
    server.server_close()


def _serve_sources(datasets_dir: Path, www: Path) -> None:
    """The official source files, rebuilt from the shared copies: Adult as is, the
    density-estimation CSVs split back into train/valid/test by the pinned sizes, the
    FIMI files gzipped."""
    files = www / "files"
    files.mkdir()
    for name in ("adult.data", "adult.test"):
        (files / name).write_bytes((datasets_dir / "adult" / name).read_bytes())
    for name in ("plants", "dna"):
        body = (datasets_dir / "wide" / f"{name}.csv").read_bytes().split(b"\n", 1)[1]
        start = 0
        for download in CATALOG[name].downloads:
            assert download.size is not None
            (files / download.filename).write_bytes(body[start : start + download.size])
            start += download.size
        assert start == len(body)
    for name, rel in (("retail", "retail/retail.dat"), ("kosarak", "kosarak/kosarak_prefix.dat")):
        data = (datasets_dir / rel).read_bytes()
        (files / f"{name}.dat.gz").write_bytes(gzip.compress(data))


def test_pinned_digests_are_the_shared_copies(datasets_dir: Path, tmp_path: Path) -> None:
    for source in CATALOG.values():
        for rel, digest in source.outputs.items():
            shared = datasets_dir / rel
            if source.name != "nltcs":  # nltcs: same rows, another row order (below)
                assert sha256_of(shared) == digest, rel


def test_fetch_over_http_verifies_and_unpacks(
    datasets_dir: Path, http_folder: tuple[Path, str], tmp_path: Path
) -> None:
    www, url = http_folder
    _serve_sources(datasets_dir, www)
    target = tmp_path / "data"
    for name in ("adult", "plants", "dna", "retail", "kosarak"):
        done = fetch(name, target, mirror=url)
        assert not done.already
        for rel, digest in CATALOG[name].outputs.items():
            assert sha256_of(target / rel) == digest
    assert (target / "kosarak" / "kosarak.dat").is_file()  # the unpinned full file
    assert fetch("adult", target, mirror=url).already  # verified files are kept
    # the loaders read what fetch wrote
    pop = load_dataset("plants", target)
    assert (pop.n, pop.d) == (23_215, 69)
    assert not list(target.glob(".fetch-*"))


def test_nltcs_rebuilds_the_same_rows(datasets_dir: Path, tmp_path: Path) -> None:
    # the benchmark files, rebuilt from the shared copy (reversed columns, same rows)
    www = tmp_path / "mirror"
    www.mkdir()
    rows = (datasets_dir / "nltcs" / "nltcs.csv").read_bytes().splitlines()[1:]
    raw = [b",".join(reversed(r.split(b","))) + b"\n" for r in rows]
    assert len(raw) == 21_574
    # the benchmark's row order is not in the shared copy: compare rows as a multiset
    downloads = CATALOG["nltcs"].downloads
    built = tmp_path / "built"
    built.mkdir()
    parts = [www / d.filename for d in downloads]
    sizes = [d.size or 0 for d in downloads]
    body = b"".join(raw)
    start = 0
    for part, size in zip(parts, sizes):
        part.write_bytes(body[start : start + size])
        start += size
    catalog._nltcs(parts, built)
    assert sorted((built / "nltcs.csv").read_bytes().splitlines()) == sorted(
        (datasets_dir / "nltcs" / "nltcs.csv").read_bytes().splitlines()
    )
    assert (
        sha256_of(built / "nltcs-domain.json")
        == CATALOG["nltcs"].outputs["nltcs/nltcs-domain.json"]
    )


# -- mechanics on a small made-up source (no shared data needed) ----------------------------
def _tiny(monkeypatch: pytest.MonkeyPatch, content: bytes) -> Source:
    import hashlib

    digest = hashlib.sha256(content).hexdigest()
    source = Source(
        name="tiny",
        title="tiny",
        home="https://example.org/",
        licence="CC0",
        citation="-",
        downloads=(Download("https://example.org/data/tiny.csv.gz"),),
        build=lambda files, folder: catalog._gunzip(files[0], folder / "tiny.csv"),
        outputs={"tiny/tiny.csv": digest},
    )
    monkeypatch.setitem(CATALOG, "tiny", source)
    return source


def test_a_checksum_mismatch_is_refused_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch, http_folder: tuple[Path, str], tmp_path: Path
) -> None:
    www, url = http_folder
    (www / "files").mkdir()
    _tiny(monkeypatch, b"a,b\n1,2\n")
    (www / "files" / "tiny.csv.gz").write_bytes(gzip.compress(b"a,b\n1,3\n"))  # tampered
    target = tmp_path / "data"
    mismatch = r"built file \(tiny/tiny.csv\) has SHA-256 [0-9a-f]{64}, must have"
    with pytest.raises(DatasetError, match=mismatch):
        fetch("tiny", target / "sub", mirror=url)
    assert not target.exists()  # not even the folders it created
    target.mkdir()
    with pytest.raises(DatasetError, match=mismatch):
        fetch("tiny", target, mirror=url)
    assert [p.name for p in target.iterdir()] == []  # no file, no staging folder
    (www / "files" / "tiny.csv.gz").write_bytes(gzip.compress(b"a,b\n1,2\n"))
    assert fetch("tiny", target, mirror=url).files == (target / "tiny" / "tiny.csv",)


def test_a_truncated_or_wrong_download_is_refused(
    monkeypatch: pytest.MonkeyPatch, http_folder: tuple[Path, str], tmp_path: Path
) -> None:
    www, url = http_folder
    (www / "files").mkdir()
    source = _tiny(monkeypatch, b"x\n")
    pinned = Download(source.downloads[0].url, "0" * 64, 10)
    monkeypatch.setitem(CATALOG, "tiny", Source(**{**source.__dict__, "downloads": (pinned,)}))
    (www / "files" / "tiny.csv.gz").write_bytes(b"12345")  # 5 of 10 bytes
    with pytest.raises(DatasetError, match=r"has 5 bytes, must have 10; nothing was kept"):
        fetch("tiny", tmp_path / "d", mirror=url)
    (www / "files" / "tiny.csv.gz").write_bytes(b"0123456789")
    with pytest.raises(DatasetError, match=r"has SHA-256 [0-9a-f]{64}, must have 0{64}"):
        fetch("tiny", tmp_path / "d", mirror=url)
    failed = r"download \(http://127.0.0.1:\d+/nope/tiny.csv.gz\) failed"
    with pytest.raises(DatasetError, match=failed):
        fetch("tiny", tmp_path / "d", mirror=url.replace("files", "nope"))
    assert not (tmp_path / "d").exists()  # a failed fetch keeps no folder it made


def test_not_a_gzip_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _tiny(monkeypatch, b"x\n")
    mirror = tmp_path / "mirror"  # a local folder works as a mirror too
    mirror.mkdir()
    (mirror / "tiny.csv.gz").write_bytes(b"plain text")
    with pytest.raises(DatasetError, match=r"download \(tiny.csv.gz\) must be a gzip file"):
        fetch("tiny", tmp_path / "d", mirror=str(mirror))


def test_unknown_and_manual_datasets(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"dataset \('nope'\) must be one of \["):
        fetch("nope", tmp_path)
    with pytest.raises(DatasetError, match=r"dataset \('acs'\) cannot be fetched automatically"):
        fetch("acs", tmp_path)


def test_cli_list_fetch_path(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["datasets", "list", "--json", "--data-dir", str(tmp_path)]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) >= {"adult", "nltcs", "acs", "retail", "kosarak", "plants", "dna"}
    for row in rows.values():
        assert row["source"].startswith("http") and row["licence"] and row["files"]
        assert all(len(d) == 64 for d in row["files"].values())
        assert row["present"] is False and row["path"].startswith(str(tmp_path))
    assert rows["adult"]["downloads"][0]["sha256"] == rows["adult"]["files"]["adult/adult.data"]
    assert main(["datasets", "path", "retail", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "retail" / "retail.dat")
    _tiny(monkeypatch, b"q\n")
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "tiny.csv.gz").write_bytes(gzip.compress(b"q\n"))
    args = ["datasets", "fetch", "tiny", "--data-dir", str(tmp_path / "d"), "--mirror", str(mirror)]
    assert main(args) == 0
    assert "tiny: fetched and verified" in capsys.readouterr().out
    assert main(args) == 0
    assert "tiny: already present" in capsys.readouterr().out
    assert main(["datasets", "fetch", "acs", "--data-dir", str(tmp_path)]) == 2
    assert "cannot be fetched automatically" in capsys.readouterr().err


def test_missing_files_get_advice_that_fits(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"CSV file \(.*mine.csv\) does not exist$"):
        load_dataset(f"csv:{tmp_path / 'mine.csv'}")
    with pytest.raises(DatasetError, match=r"run `calmkit datasets fetch retail`"):
        load_dataset("retail", tmp_path)
    with pytest.raises(DatasetError, match=r"run `calmkit datasets fetch plants`"):
        load_dataset("plants", tmp_path)


def test_fetch_writes_to_calmkit_data_when_set(
    datasets_dir: Path,
    http_folder: tuple[Path, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the guides say: point CALMKIT_DATA at a folder, fetch, and the loaders read it;
    # fetch used to write to the per-user folder instead, which CALMKIT_DATA hides
    www, url = http_folder
    _serve_sources(datasets_dir, www)
    target = tmp_path / "chosen"
    monkeypatch.setenv("CALMKIT_DATA", str(target))
    monkeypatch.setattr(catalog, "user_data_dir", lambda: tmp_path / "per-user")
    assert main(["datasets", "fetch", "adult", "--mirror", url]) == 0
    assert (
        sha256_of(target / "adult" / "adult.data") == CATALOG["adult"].outputs["adult/adult.data"]
    )
    assert not (tmp_path / "per-user").exists()
    assert load_dataset("adult").n > 30_000


def test_the_data_folder_is_calmkit_data_or_the_per_user_one_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the help says $CALMKIT_DATA, else the per-user folder; a ../shared/datasets
    # beside the checkout or the working directory was once taken in silence
    from calmkit_simulator import datasets

    (tmp_path / "shared" / "datasets" / "adult").mkdir(parents=True)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.delenv("CALMKIT_DATA", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert datasets.user_data_dir() == tmp_path / "xdg" / "calmkit" / "datasets"
    assert datasets.default_data_dir() is None
    with pytest.raises(DatasetError, match=r"dataset \('adult'\) is not on this machine"):
        load_dataset("adult")
    datasets.user_data_dir().mkdir(parents=True)
    assert datasets.default_data_dir() == datasets.user_data_dir()
    monkeypatch.setenv("CALMKIT_DATA", str(tmp_path / "chosen"))
    assert datasets.default_data_dir() == tmp_path / "chosen"
