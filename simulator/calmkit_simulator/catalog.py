"""The datasets calmkit knows: where each comes from, under which licence, and how to
fetch and verify it (``calmkit datasets list | fetch NAME | path NAME``).

Every file is checked by SHA-256: each download whose bytes are published at a fixed
address is pinned, and so is every file calmkit builds from the downloads (the exact
bytes the loaders in :mod:`calmkit_simulator.datasets` read and calmkit's published
results used). A fetch writes into a temporary folder beside the target and moves the
verified files into place only when every check passed: a failed or interrupted fetch
leaves nothing half-written.

Downloads come from the official sources; ``mirror`` (or ``$CALMKIT_DATASET_MIRROR``)
replaces them by a folder or URL holding the same files under their original base names
(for machines without internet access, and for the tests).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .datasets import DatasetError, default_data_dir, fetch_dir, user_data_dir

__all__ = [
    "CATALOG",
    "MIRROR_ENV",
    "Download",
    "Fetched",
    "Source",
    "dataset_path",
    "fetch",
    "sha256_of",
    "user_data_dir",
]

MIRROR_ENV = "CALMKIT_DATASET_MIRROR"
_CHUNK = 1 << 20
_TIMEOUT_S = 60.0
_DE_DATASETS = (  # UCLA-StarAI density-estimation benchmark, pinned to one commit
    "https://raw.githubusercontent.com/UCLA-StarAI/Density-Estimation-Datasets/"
    "37d53c1a8ba488d0a39e8c64bd3387577080b143/datasets"
)


@dataclass(frozen=True)
class Download:
    """One file at its official address; ``sha256``/``size`` of its bytes, or None
    where the publisher's bytes are not pinned (then the built files are checked)."""

    url: str
    sha256: str | None = None
    size: int | None = None

    @property
    def filename(self) -> str:
        return Path(urllib.parse.urlparse(self.url).path).name


@dataclass(frozen=True)
class Source:
    """A dataset: its provenance and how its files are built from the downloads.

    ``outputs`` maps each file (relative to the data folder) to its SHA-256;
    ``build(downloads, folder)`` writes them from the downloaded files (in
    ``downloads`` order). ``manual`` says how to obtain a dataset that has no
    download calmkit can verify."""

    name: str
    title: str
    home: str
    licence: str
    citation: str
    outputs: dict[str, str]
    downloads: tuple[Download, ...] = ()
    build: Callable[[Sequence[Path], Path], None] | None = None
    manual: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def fetchable(self) -> bool:
        return self.build is not None and bool(self.downloads)


# -- builders -------------------------------------------------------------------------------
def _copy(files: Sequence[Path], folder: Path, names: Sequence[str]) -> None:
    for src, name in zip(files, names):
        shutil.copyfile(src, folder / name)


def _gunzip(src: Path, dst: Path, max_lines: int | None = None) -> None:
    try:
        with gzip.open(src, "rb") as fin, dst.open("wb") as fout:
            if max_lines is None:
                shutil.copyfileobj(fin, fout, _CHUNK)
            else:
                for i, line in enumerate(fin):
                    if i == max_lines:
                        break
                    fout.write(line)
    except (OSError, EOFError) as exc:  # BadGzipFile is an OSError
        raise DatasetError(f"download ({src.name}) must be a gzip file: {exc}") from None


def _concat_binary_csv(files: Sequence[Path], dst: Path, names: Sequence[str] | None) -> None:
    """train + valid + test rows of a density-estimation dataset as one CSV with a
    header (``names``, or a0, a1, ... in the files' column order)."""
    with dst.open("wb") as out:
        first = files[0].read_bytes().split(b"\n", 1)[0]
        width = first.count(b",") + 1
        header = list(names) if names is not None else [f"a{i}" for i in range(width)]
        out.write((",".join(header) + "\n").encode())
        for src in files:
            out.write(src.read_bytes())


def _kosarak(files: Sequence[Path], folder: Path) -> None:
    _gunzip(files[0], folder / "kosarak_prefix.dat", KOSARAK_PREFIX_LINES)
    _gunzip(files[0], folder / "kosarak.dat")


def _nltcs(files: Sequence[Path], folder: Path) -> None:
    # the benchmark stores the 16 items in reverse order of the survey's item list
    rows = b"".join(src.read_bytes() for src in files).splitlines()
    with (folder / "nltcs.csv").open("wb") as out:
        out.write((",".join(NLTCS_ITEMS) + "\n").encode())
        for row in rows:
            out.write(b",".join(reversed(row.split(b","))) + b"\n")
    sizes = ", ".join(f'"{name}": 2' for name in sorted(NLTCS_ITEMS))
    (folder / "nltcs-domain.json").write_text("{" + sizes + "}")


NLTCS_ITEMS = (
    "eating",
    "getting in/out of bed",
    "getting around inside",
    "dressing",
    "bathing",
    "using toilet",
    "heavy house work",
    "light house work",
    "laundry",
    "cooking",
    "grocery shopping",
    "getting about outside",
    "traveling",
    "managing money",
    "taking medicine",
    "telephoning",
)
KOSARAK_PREFIX_LINES = 36_682

_UCI_ADULT = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult"
_FIMI = "https://fimi.uantwerpen.be/data"

CATALOG: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            name="adult",
            title="UCI Adult (Census Income), 48,842 rows, 15 attributes",
            home="https://archive.ics.uci.edu/dataset/2/adult",
            licence="CC BY 4.0",
            citation="Becker, B. and Kohavi, R. (1996). Adult. UCI Machine Learning "
            "Repository. https://doi.org/10.24432/C5XW20",
            downloads=(
                Download(
                    f"{_UCI_ADULT}/adult.data",
                    "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
                    3_974_305,
                ),
                Download(
                    f"{_UCI_ADULT}/adult.test",
                    "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
                    2_003_153,
                ),
            ),
            build=lambda files, folder: _copy(files, folder, ("adult.data", "adult.test")),
            outputs={
                "adult/adult.data": "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",  # noqa: E501
                "adult/adult.test": "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",  # noqa: E501
            },
        ),
        Source(
            name="nltcs",
            title="National Long Term Care Survey, 21,574 rows, 16 binary disability items",
            home="https://github.com/UCLA-StarAI/Density-Estimation-Datasets",
            licence="research use; cite NLTCS (Duke University Center for Demographic "
            "Studies) and the benchmark (Lowd and Davis, ICDM 2010)",
            citation="Lowd, D. and Davis, J. (2010). Learning Markov network structure with "
            "decision trees. ICDM. https://doi.org/10.1109/ICDM.2010.128",
            downloads=(
                Download(
                    f"{_DE_DATASETS}/nltcs/nltcs.train.data",
                    "e547a7aedad1dd2f7177030881ab1b92c7e24ae5464c71a0f1f89daecaf52b30",
                    517_792,
                ),
                Download(
                    f"{_DE_DATASETS}/nltcs/nltcs.valid.data",
                    "93bbbf5c6febdc9bc6e5b5bfab636f4dc0685ab2896d24b23dd267794c3bfcf6",
                    69_024,
                ),
                Download(
                    f"{_DE_DATASETS}/nltcs/nltcs.test.data",
                    "f9ffa6b74b27dc03bee3203d157ee31079e80b13be40d0c0093d635c25aed523",
                    103_552,
                ),
            ),
            build=_nltcs,
            notes=(
                "the same 21,574 rows as the copy behind docs/, in the benchmark's row "
                "order (resampled runs differ by that order only)",
            ),
            outputs={
                "nltcs/nltcs.csv": "5249a1548fbf6232031fb615c7160634ac60ca4a51df8880b2bc30fd472a179f",  # noqa: E501
                "nltcs/nltcs-domain.json": "39ffb870b7085ba5f69bf3a3303190683d6bc1fd14c97abf3a1c335f40b32cc6",  # noqa: E501
            },
        ),
        Source(
            name="retail",
            title="FIMI retail: 88,162 market baskets of a Belgian supermarket",
            home="http://fimi.uantwerpen.be/data/",
            licence="free for research use (FIMI repository); cite Brijs et al. (1999)",
            citation="Brijs, T. et al. (1999). Using association rules for product assortment "
            "decisions: a case study. KDD. https://doi.org/10.1145/312129.312241",
            downloads=(Download(f"{_FIMI}/retail.dat.gz"),),
            build=lambda files, folder: _gunzip(files[0], folder / "retail.dat"),
            outputs={
                "retail/retail.dat": "71493b31bf628c790a489f75fa93c9971b5b526e926b785209c7b8357f9ff5cd"  # noqa: E501
            },
            notes=("the archive is not pinned; the unpacked retail.dat is",),
        ),
        Source(
            name="kosarak",
            title="FIMI kosarak: 990,002 click streams of a Hungarian news portal "
            "(calmkit's experiments use the first 36,682)",
            home="http://fimi.uantwerpen.be/data/",
            licence="free for research use (FIMI repository; donated by Ferenc Bodon)",
            citation="Goethals, B. and Zaki, M. J. (2003). FIMI'03: Workshop on Frequent "
            "Itemset Mining Implementations. http://fimi.uantwerpen.be/",
            downloads=(Download(f"{_FIMI}/kosarak.dat.gz"),),
            build=_kosarak,
            outputs={
                "kosarak/kosarak_prefix.dat": "6307352eb059e11daae3e69e70d9abbee566ea07dd60dee65e8219d6c55da523"  # noqa: E501
            },
            notes=(
                "the first 36,682 lines (kosarak_prefix.dat, what the loader reads) are "
                "pinned; the full kosarak.dat is kept beside it unverified",
            ),
        ),
        Source(
            name="plants",
            title="Plants: USDA species presence in 69 US states and regions, 23,215 rows",
            home="https://github.com/UCLA-StarAI/Density-Estimation-Datasets",
            licence="USDA PLANTS data (public domain) via the UCI Plants dataset; cite the "
            "benchmark (Lowd and Davis, ICDM 2010)",
            citation="Lowd, D. and Davis, J. (2010). Learning Markov network structure with "
            "decision trees. ICDM. https://doi.org/10.1109/ICDM.2010.128",
            downloads=(
                Download(
                    f"{_DE_DATASETS}/plants/plants.train.data",
                    "1fb1219ff94068d12a563f9e81f8889a1885f41e867884cff608669300c6848f",
                    2_402_856,
                ),
                Download(
                    f"{_DE_DATASETS}/plants/plants.valid.data",
                    "47834ed318b2d74f48e4b083226ef47fd446d41986012ceae19d230574821b34",
                    320_298,
                ),
                Download(
                    f"{_DE_DATASETS}/plants/plants.test.data",
                    "95f53c033cd1d86467aec2610dc5bfe014534206c2da4919f73bcab246ab8755",
                    480_516,
                ),
            ),
            build=lambda files, folder: _concat_binary_csv(files, folder / "plants.csv", None),
            outputs={
                "wide/plants.csv": "986127564e7fe42879b2199c4de8ead32941f5a6eaf0abd8daa33900f2406eda"  # noqa: E501
            },
        ),
        Source(
            name="dna",
            title="DNA: binarized splice-junction features, 180 attributes, 3,186 rows",
            home="https://github.com/UCLA-StarAI/Density-Estimation-Datasets",
            licence="Statlog DNA (UCI); cite the benchmark (Van Haaren and Davis, AAAI 2012)",
            citation="Van Haaren, J. and Davis, J. (2012). Markov network structure learning: "
            "a randomized feature generation approach. AAAI.",
            downloads=(
                Download(
                    f"{_DE_DATASETS}/dna/dna.train.data",
                    "bb8de0ca4b6ad9b610036b7a302962ebecd4b504354b14c02c7d0bee48d207d9",
                    576_000,
                ),
                Download(
                    f"{_DE_DATASETS}/dna/dna.valid.data",
                    "4b0fc89cda5eaf5c75926e281afb6af99de194a546070d5b81b524ba251f4f3f",
                    144_000,
                ),
                Download(
                    f"{_DE_DATASETS}/dna/dna.test.data",
                    "fec3ae7b26804020a9c43c99828441c5e08bb76b23719368a74ad2b09af99100",
                    426_960,
                ),
            ),
            build=lambda files, folder: _concat_binary_csv(files, folder / "dna.csv", None),
            outputs={
                "wide/dna.csv": "4f0c1bbf21ae0218bb87d2dc2cae21d2f71181448da5359d9aa4ae5558bbbf80"
            },
        ),
        Source(
            name="acs",
            title="ACS: IPUMS-USA American Community Survey extract, 47,461 rows, 23 binary "
            "attributes (PrivBayes binarization)",
            home="https://usa.ipums.org/",
            licence="IPUMS-USA terms of use (registration); the binarized extract was "
            "redistributed with PrivBayes (Apache-2.0)",
            citation="Zhang, J. et al. (2017). PrivBayes: private data release via Bayesian "
            "networks. ACM TODS 42(4). https://doi.org/10.1145/3134428",
            outputs={
                "acs/acs.csv": "89e337a3431f9b3f76d84142cb048495fec93ff10018b1f38b25a19491582cc8"
            },
            manual="no public address serves this extract as a file calmkit can pin; obtain "
            "the PrivBayes ACS extract (23 binary columns, header 0..22) and place it at "
            "the path `calmkit datasets path acs` prints",
        ),
    )
}


# -- fetching ---------------------------------------------------------------------------------
def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _address(download: Download, mirror: str | None) -> str:
    if not mirror:
        return download.url
    if "://" not in mirror:  # a local folder
        return Path(mirror, download.filename).resolve().as_uri()
    return mirror.rstrip("/") + "/" + download.filename


def _download(url: str, dst: Path, expected: Download) -> None:
    digest, size = hashlib.sha256(), 0
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as resp, dst.open("wb") as out:
            for block in iter(lambda: resp.read(_CHUNK), b""):
                digest.update(block)
                size += len(block)
                out.write(block)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise DatasetError(f"download ({url}) failed: {exc}") from None
    if expected.size is not None and size != expected.size:
        raise DatasetError(
            f"download ({url}) has {size} bytes, must have {expected.size}; nothing was kept"
        )
    if expected.sha256 is not None and digest.hexdigest() != expected.sha256:
        raise DatasetError(
            f"download ({url}) has SHA-256 {digest.hexdigest()}, must have {expected.sha256}; "
            "nothing was kept"
        )


@dataclass(frozen=True)
class Fetched:
    """What :func:`fetch` did: the files in place, and whether they were already."""

    name: str
    folder: Path
    files: tuple[Path, ...]
    already: bool


def _present(source: Source, folder: Path) -> bool:
    return all((folder / rel).is_file() for rel in source.outputs) and all(
        sha256_of(folder / rel) == digest for rel, digest in source.outputs.items()
    )


def fetch(
    name: str,
    folder: Path | str | None = None,
    mirror: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> Fetched:
    """Download, verify and unpack dataset ``name`` into ``folder`` (default
    ``$CALMKIT_DATA`` when set, else the per-user folder). Files already there and
    verified are kept as they are.
    Raises :class:`DatasetError` (nothing written) on any failed check."""
    source = _source(name)
    if not source.fetchable:
        raise DatasetError(f"dataset ({name!r}) cannot be fetched automatically: {source.manual}")
    target = Path(folder) if folder is not None else fetch_dir()
    if _present(source, target):
        return Fetched(name, target, tuple(target / r for r in source.outputs), True)
    mirror = mirror if mirror is not None else os.environ.get(MIRROR_ENV) or None
    created = _missing_parents(target)
    target.mkdir(parents=True, exist_ok=True)
    try:
        return _fetch_into(source, name, target, mirror, progress)
    except BaseException:
        for folder_made in created:  # a failed fetch leaves no folder of its own behind
            with contextlib.suppress(OSError):
                folder_made.rmdir()  # only if still empty
        raise


def _missing_parents(path: Path) -> list[Path]:
    """``path`` and its missing ancestors, deepest first (what ``mkdir(parents=True)``
    would create)."""
    out = []
    while not path.exists():
        out.append(path)
        path = path.parent
    return out


def _fetch_into(
    source: Source,
    name: str,
    target: Path,
    mirror: str | None,
    progress: Callable[[str], None] | None,
) -> Fetched:
    """:func:`fetch`'s work once ``target`` exists."""
    with _staging(target) as stage:
        raw = stage / ".downloads"
        raw.mkdir()
        files = []
        for download in source.downloads:
            url = _address(download, mirror)
            if progress:
                progress(f"downloading {url}")
            path = raw / download.filename
            _download(url, path, download)
            files.append(path)
        built = stage / "built"
        for rel in source.outputs:
            (built / rel).parent.mkdir(parents=True, exist_ok=True)
        subfolder = built / Path(next(iter(source.outputs))).parent
        assert source.build is not None
        source.build(files, subfolder)
        for rel, digest in source.outputs.items():
            path = built / rel
            actual = sha256_of(path) if path.is_file() else "missing"
            if actual != digest:
                raise DatasetError(
                    f"built file ({rel}) has SHA-256 {actual}, must have {digest}; nothing "
                    "was kept (the source may have changed: report it to calmkit)"
                )
        placed = []
        for rel in source.outputs:  # all checks passed: move into place
            dst = target / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(built / rel, dst)
            placed.append(dst)
        for extra in sorted(subfolder.iterdir()):  # unpinned extras (the full kosarak)
            dst = target / Path(next(iter(source.outputs))).parent / extra.name
            os.replace(extra, dst)
            placed.append(dst)
    return Fetched(name, target, tuple(placed), False)


@contextmanager
def _staging(target: Path) -> Iterator[Path]:
    """A temporary folder inside ``target`` (same file system: moves are atomic),
    removed afterwards whatever happened."""
    stage = Path(tempfile.mkdtemp(prefix=".fetch-", dir=target))
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _source(name: str) -> Source:
    try:
        return CATALOG[name]
    except KeyError:
        raise DatasetError(f"dataset ({name!r}) must be one of {sorted(CATALOG)}") from None


def dataset_path(name: str, folder: Path | str | None = None) -> Path:
    """Where the loaders look for ``name``'s first file."""
    source = _source(name)
    base = Path(folder) if folder is not None else default_data_dir() or user_data_dir()
    return base / next(iter(source.outputs))
