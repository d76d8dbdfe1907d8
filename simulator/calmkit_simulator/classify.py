"""The classification experiment of the CALM paper (CALM, ACM CCS 2018, §5.4, Fig. 6).

Protocol (§5.4): pick five features and a label; split the records 80% / 20% into a
training and a test set (uniformly at random from ``rng``); each mechanism collects
from the training users and outputs the 6-way marginal over features + label; a
synthetic training set of the same size is sampled from that marginal
(:func:`sample_records`) and a linear SVM is trained on it; the score is the
misclassification rate on the real test records (:func:`misclassification`). Two
baselines share the split: *NoNoise* trains the same SVM on the real training records
(same attributes, no privacy) and *Majority* always predicts the training split's
majority label. The paper also duplicates the training users 4x and 16x (its panels
n = 2^16, 2^18, 2^20) to show that more users help; ``duplicate`` tiles the training
records (``np.tile``) before the mechanism sees them.

Privacy accounting: only the mechanism touches the training records, once, under its
own epsilon (:attr:`Mechanism.privacy_unit`; for the LDP mechanisms each training user
reports once). Sampling the synthetic set and training the SVM are post-processing of
the release, so the trained model is as private as the release. With ``duplicate > 1``
a real person stands behind ``duplicate`` simulated users, so the guarantee per
*person* is ``duplicate * epsilon`` (group privacy); it is a simulation of a larger
population, as in the paper. NoNoise and Majority are non-private references; the test
split is never shown to a mechanism.

Which attributes the mechanism sees (``scope``): ``"selected"`` (default) restricts
the training records to the six attributes (``Population.select``) and runs the
mechanism with k = 6 over d = 6, so it collects exactly the one marginal the classifier
needs. ``"all"`` runs it over all d attributes with k = 6 and asks for the one 6-way
marginal, which is what the paper's figure labels ("Adult, d = 15, k = 6") suggest and
why some methods (FC, AM) are "not scalable" there; it is the harder, paper-like
setting.

Presets: :func:`adult_setting` (the paper's Adult features, attributes capped at 3
categories: the "non-binary partition" panels; ``max_categories=2``: the "binary
partition" panels) and :func:`acs_setting` (a documented deviation: our ACS file has no
column names, so the paper's US features cannot be picked by name).

scikit-learn (the ``figures`` extra) is imported lazily, so the module imports without
it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import xlogy

from calmkit_client import CalmkitError, validate_epsilon
from calmkit_client.randomness import RngLike
from calmkit_client.schema import AttrRef
from calmkit_client.validation import check_int, is_int

from .datasets import load_dataset
from .mechanisms import Mechanism
from .population import Population

__all__ = [
    "ADULT_FEATURES",
    "ADULT_LABEL",
    "SCOPES",
    "SETTINGS",
    "SVM_OPTIONS",
    "ClassificationError",
    "ClassificationRep",
    "ClassificationSetting",
    "acs_setting",
    "adult_binary_setting",
    "adult_setting",
    "balanced_label",
    "load_setting",
    "misclassification",
    "mutual_information",
    "run_classification",
    "sample_records",
    "svm_predict",
    "top_features",
]


class ClassificationError(CalmkitError):
    """A classification input is malformed, or scikit-learn is missing."""


# LinearSVC settings (stated, fixed). dual=False: liblinear's primal solver, the one
# scikit-learn recommends when records outnumber features (here thousands of records,
# at most a few dozen one-hot columns); it is deterministic, so random_state (drawn
# from the rng anyway) does not change the result.
SVM_OPTIONS: dict[str, Any] = {
    "penalty": "l2",
    "loss": "squared_hinge",
    "C": 1.0,
    "dual": False,
    "tol": 1e-4,
    "max_iter": 1000,
    "fit_intercept": True,
    "intercept_scaling": 1.0,
}


def _sklearn() -> tuple[Any, Any]:
    """(OneHotEncoder, LinearSVC), or a ClassificationError saying how to install."""
    try:
        from sklearn.preprocessing import OneHotEncoder
        from sklearn.svm import LinearSVC
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ClassificationError(
            f"scikit-learn ({exc.name or 'sklearn'}) is needed for the classification "
            'experiment: pip install "calmkit[figures]"'
        ) from exc
    return OneHotEncoder, LinearSVC


# -- sampling a synthetic dataset from a marginal -------------------------------------------
def sample_records(table: np.ndarray, n: int, rng: RngLike = None) -> np.ndarray:
    """``n`` records drawn i.i.d. from the marginal ``table`` (any shape (s_1..s_j)).

    Negative cells (an unbiased estimate's noise) are clipped to 0 and the rest
    renormalised (§5.4: "a synthetic dataset is generated based on this marginal").
    Returns int64 codes of shape ``(n, table.ndim)``: column i is the code along axis i.
    """
    t = np.asarray(table, dtype=np.float64)
    n = check_int("n", n, 0, ClassificationError)
    if t.ndim < 1 or t.size == 0:
        raise ClassificationError(f"table (shape {t.shape}) must have at least one cell")
    if not np.all(np.isfinite(t)):
        raise ClassificationError("table (has NaN or inf cells) must be finite")
    p = np.clip(t, 0.0, None).ravel()
    total = float(p.sum())
    if not total > 0:
        raise ClassificationError(
            f"table (sum of non-negative cells {total}) must have positive mass to sample from"
        )
    gen = np.random.default_rng(rng)
    cells = gen.choice(p.size, size=n, p=p / total)  # one draw over the flat cells
    return np.column_stack(np.unravel_index(cells, t.shape)).astype(np.int64).reshape(n, t.ndim)


# -- the classifier --------------------------------------------------------------------------
def _labels(y: np.ndarray, x: np.ndarray, name: str) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] != x.shape[0]:
        raise ClassificationError(
            f"{name} (shape {y.shape}) must be 1-D with one label per record ({x.shape[0]})"
        )
    return y


def _features(x: np.ndarray, name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ClassificationError(f"{name} (shape {x.shape}) must be 2-D with >= 1 row and column")
    return x


def svm_predict(
    train_X: np.ndarray,
    train_y: np.ndarray,
    test_X: np.ndarray,
    rng: RngLike = 0,
) -> np.ndarray:
    """Labels a linear SVM trained on categorical features predicts for ``test_X``.

    ``train_X`` (n, f) and ``test_X`` (t, f) are integer codes, ``train_y`` (n,) labels.
    Features are one-hot encoded (``OneHotEncoder``, categories seen in training;
    unseen test categories encode as all zeros) and
    ``sklearn.svm.LinearSVC(**SVM_OPTIONS, random_state=<drawn from rng>)`` is trained
    (one-vs-rest if there are more than two labels). If the training labels have a
    single class, that class is predicted. Returns shape (t,), ``train_y``'s dtype.

    Speed: records are categorical, so identical training rows are merged into one row
    with ``sample_weight`` = its multiplicity. liblinear weighs each row's loss by
    ``C * weight``, so the objective, hence the model, is the one trained on the raw
    rows; training time then depends on the number of distinct rows, not on n.
    """
    train_X, test_X = _features(train_X, "train_X"), _features(test_X, "test_X")
    train_y = _labels(train_y, train_X, "train_y")
    if train_X.shape[1] != test_X.shape[1]:
        raise ClassificationError(
            f"test_X ({test_X.shape[1]} columns) must have the {train_X.shape[1]} columns of "
            "train_X"
        )
    classes = np.unique(train_y)
    if classes.size == 1:  # nothing to learn: predict the only class seen
        return np.full(test_X.shape[0], classes[0], dtype=train_y.dtype)
    encoder_cls, svm_cls = _sklearn()
    gen = np.random.default_rng(rng)
    seed = int(gen.integers(2**31 - 1))
    rows, weights = np.unique(
        np.column_stack([train_X, train_y]).astype(np.int64), axis=0, return_counts=True
    )
    encoder = encoder_cls(handle_unknown="ignore", dtype=np.float64)
    svm = svm_cls(**SVM_OPTIONS, random_state=seed)
    svm.fit(encoder.fit_transform(rows[:, :-1]), rows[:, -1], sample_weight=weights)
    test_rows, inverse = np.unique(test_X.astype(np.int64), axis=0, return_inverse=True)
    predicted = np.asarray(svm.predict(encoder.transform(test_rows)))[inverse.reshape(-1)]
    return predicted.astype(train_y.dtype, copy=False)


def misclassification(
    train_X: np.ndarray,
    train_y: np.ndarray,
    test_X: np.ndarray,
    test_y: np.ndarray,
    rng: RngLike = 0,
) -> float:
    """Test error rate (float in [0, 1]) of :func:`svm_predict` trained on
    (``train_X`` (n, f), ``train_y`` (n,)): the fraction of the t test records
    (``test_X`` (t, f), ``test_y`` (t,)) whose label it gets wrong."""
    test_X = _features(test_X, "test_X")
    test_y = _labels(test_y, test_X, "test_y")
    return float(np.mean(svm_predict(train_X, train_y, test_X, rng) != test_y))


# -- settings (features + label of a dataset) --------------------------------------------------
@dataclass(frozen=True)
class ClassificationSetting:
    """A population with ``features`` (attribute positions) and a ``label`` position.

    The mechanism is asked for the marginal over :attr:`attributes` = features + label
    (k = :attr:`k`); ``notes`` say how the setting was chosen.
    """

    population: Population
    features: tuple[int, ...]
    label: int
    name: str = "classification"
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        d = self.population.d
        features = tuple(self.features)
        for pos in (*features, self.label):
            if not is_int(pos) or not 0 <= pos < d:
                raise ClassificationError(
                    f"attribute position ({pos!r}) must be an int in [0, {d})"
                )
        if not features:
            raise ClassificationError("features (()) must name at least one attribute")
        if len(set(features)) != len(features):
            raise ClassificationError(f"features ({list(features)}) must be distinct")
        if self.label in features:
            raise ClassificationError(f"label ({self.label}) must not be one of the features")
        if self.population.schema.sizes[self.label] < 2:
            raise ClassificationError(
                f"label ({self.label_name!r}, 1 category) must have at least 2 categories"
            )
        object.__setattr__(self, "features", tuple(int(f) for f in features))
        object.__setattr__(self, "label", int(self.label))
        object.__setattr__(self, "notes", tuple(self.notes))

    @classmethod
    def from_names(
        cls,
        population: Population,
        features: Sequence[AttrRef],
        label: AttrRef,
        name: str = "classification",
        notes: Sequence[str] = (),
    ) -> ClassificationSetting:
        """Features and label by attribute name (or position)."""
        schema = population.schema
        return cls(population, schema.resolve(features), schema.index(label), name, tuple(notes))

    @property
    def attributes(self) -> tuple[int, ...]:
        """Positions of the features, then the label (the marginal's axis order)."""
        return (*self.features, self.label)

    @property
    def k(self) -> int:
        return len(self.attributes)

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(self.population.schema.attributes[i].name for i in self.features)

    @property
    def label_name(self) -> str:
        return self.population.schema.attributes[self.label].name

    def describe(self) -> str:
        lines = [
            f"{self.name}: label {self.label_name!r}, features {list(self.feature_names)}",
            self.population.describe(),
        ]
        return "\n".join([*lines, *(f"  note: {note}" for note in self.notes)])


# the paper's Adult setting (§5.4)
ADULT_FEATURES = ("age", "workclass", "education", "education-num", "occupation")
ADULT_LABEL = "income"


def adult_setting(
    data_dir: Path | str | None = None, max_categories: int = 3
) -> ClassificationSetting:
    """Adult with the paper's features (age, workclass, education, education-num,
    occupation) and label income, every attribute capped at ``max_categories``
    (3: the paper's "non-binary partition"; 2: its "binary partition")."""
    check_int("max_categories", max_categories, 2, ClassificationError)
    pop = load_dataset("adult", data_dir, max_categories=max_categories)
    return ClassificationSetting.from_names(
        pop,
        ADULT_FEATURES,
        ADULT_LABEL,
        f"adult-c{max_categories}",
        (f"paper's features (§5.4); attributes capped at {max_categories} categories",),
    )


def adult_binary_setting(data_dir: Path | str | None = None) -> ClassificationSetting:
    """:func:`adult_setting` with every attribute capped at 2 categories."""
    return adult_setting(data_dir, max_categories=2)


def mutual_information(population: Population, a: int, b: int) -> float:
    """Empirical mutual information (nats) between attribute positions ``a`` and ``b``
    (``a == b``: the entropy of ``a``)."""
    if a == b:  # I(a; a) = H(a)
        joint = np.diag(population.marginal([a]))
    else:
        joint = population.marginal([a, b]) if a < b else population.marginal([b, a]).T
    pa = joint.sum(axis=1, keepdims=True)
    pb = joint.sum(axis=0, keepdims=True)
    # sum p(x,y) log(p(x,y) / (p(x) p(y))); xlogy makes 0 log 0 = 0
    return float((xlogy(joint, joint) - xlogy(joint, pa * pb)).sum())


def balanced_label(population: Population) -> int:
    """The attribute whose most frequent category is rarest (the most balanced one;
    ties: smallest position)."""
    top = [population.counts([j]).max() for j in range(population.d)]
    return int(np.argmin(top))


def top_features(population: Population, label: int, count: int = 5) -> tuple[int, ...]:
    """The ``count`` attributes with the highest empirical mutual information with
    ``label`` (ties: smallest position), in decreasing order of it."""
    count = check_int("count", count, 1, ClassificationError)
    others = [j for j in range(population.d) if j != label]
    if count > len(others):
        raise ClassificationError(
            f"count ({count}) must be at most the {len(others)} other attributes"
        )
    mi = np.array([mutual_information(population, j, label) for j in others])
    order = np.lexsort((np.asarray(others), -mi))  # by MI descending, then position
    return tuple(others[i] for i in order[:count])


def acs_setting(data_dir: Path | str | None = None, count: int = 5) -> ClassificationSetting:
    """ACS (23 binary attributes, PrivBayes binarization).

    Deviation from the paper: its US features (WRKRECAL, GRADEATT, SCHLTYPE, SCHOOL,
    DIFFPHYS) and income label cannot be found in our file, whose header is only column
    numbers. The setting is chosen reproducibly from the data instead: label = the most
    balanced column (:func:`balanced_label`; column "19", about 50% ones), features =
    the ``count`` columns with the highest mutual information with it
    (:func:`top_features`). This selection looks at all records, the test split
    included, and is not private: it stands in for the paper's semantic choice.
    """
    pop = load_dataset("acs", data_dir)
    label = balanced_label(pop)
    features = top_features(pop, label, count)
    note = (
        "deviation: ACS columns are unnamed, so label = most balanced column, features = "
        f"the {count} with highest mutual information with it (chosen on all records)"
    )
    return ClassificationSetting(pop, features, label, "acs", (note,))


SETTINGS: dict[str, Callable[[Path | str | None], ClassificationSetting]] = {
    "adult": adult_setting,
    "adult-binary": adult_binary_setting,
    "acs": acs_setting,
}


def load_setting(name: str, data_dir: Path | str | None = None) -> ClassificationSetting:
    """The preset called ``name`` (see :data:`SETTINGS`)."""
    if name not in SETTINGS:
        raise ClassificationError(f"setting ({name!r}) must be one of {sorted(SETTINGS)}")
    return SETTINGS[name](data_dir)


# -- one repetition of the experiment ---------------------------------------------------------
@dataclass(frozen=True)
class ClassificationRep:
    """One repetition: test error of the SVM trained on the mechanism's synthetic data
    (``error``), of NoNoise and of Majority (fractions of the test split), the wall time
    of the mechanism's pipeline (collection + release + sampling + training) and what
    the mechanism chose (``Release.describe()``)."""

    error: float
    nonoise: float
    majority: float
    seconds: float
    chosen: dict[str, object]


SCOPES = ("selected", "all")


def run_classification(
    population: Population,
    setting: ClassificationSetting,
    mechanism: Mechanism,
    epsilon: float,
    rng: RngLike = 0,
    duplicate: int = 1,
    test_fraction: float = 0.2,
    scope: str = "selected",
    method_rng: RngLike = None,
) -> ClassificationRep:
    """One repetition of §5.4 on ``population`` with ``setting``'s features and label.

    ``population`` must have the attributes of ``setting.population`` (same names at
    the setting's positions), e.g. the setting's own population or a resample of it.
    Randomness: ``rng`` seeds the split (and NoNoise's SVM); ``method_rng`` the
    mechanism, the sampling of its synthetic records and their SVM (default: a child
    spawned from ``rng``). The split never depends on the mechanism: calls that differ
    only in it (or in ``method_rng``) test on the same records.
    Steps: ``round(test_fraction * n)`` records, drawn with ``rng``, form the test split;
    the rest are the training users, tiled ``duplicate`` times (``np.tile``); the
    mechanism runs on them (``scope``: see the module docstring) with k = setting.k and
    answers the marginal over features + label; a synthetic training set of the same
    size (n_train * duplicate) is sampled from it and an SVM trained
    (:func:`misclassification`). NoNoise trains on the real (tiled) training records;
    Majority predicts the training split's most frequent label (ties: smallest code).

    ``mechanism.check`` runs first: :class:`~.mechanisms.NotScalable` propagates
    before any work.
    """
    eps = validate_epsilon(epsilon)
    duplicate = check_int("duplicate", duplicate, 1, ClassificationError)
    if scope not in SCOPES:
        raise ClassificationError(f"scope ({scope!r}) must be one of {list(SCOPES)}")
    frac = float(test_fraction)
    if not 0.0 < frac < 1.0:
        raise ClassificationError(f"test_fraction ({test_fraction!r}) must be in (0, 1)")
    names = population.schema.names
    for pos in setting.attributes:
        want = setting.population.schema.attributes[pos].name
        if pos >= population.d or names[pos] != want:
            raise ClassificationError(
                f"population ({population.name}) must have attribute {want!r} at position {pos}"
            )
    n_test = round(frac * population.n)
    n_train = population.n - n_test
    if n_test < 1 or n_train < 1:
        raise ClassificationError(
            f"population (n={population.n}) with test_fraction {frac} must leave at least one "
            "training and one test record"
        )
    attrs, k = setting.attributes, setting.k
    schema = population.select(attrs).schema if scope == "selected" else population.schema
    mechanism.check(schema, n_train * duplicate, eps, k)  # before any work

    gen = np.random.default_rng(rng)
    method = gen.spawn(1)[0] if method_rng is None else np.random.default_rng(method_rng)
    order = gen.permutation(population.n)
    test, train = order[:n_test], order[n_test:]
    codes = population.codes if scope == "all" else population.codes[:, list(attrs)]
    train_codes = np.tile(codes[train], (duplicate, 1))
    note = f"training split: {n_train} of {population.n} users" + (
        f", tiled {duplicate}x" if duplicate > 1 else ""
    )
    train_pop = Population(schema, train_codes, population.name, (*population.notes, note))
    # positions of features + label inside the mechanism's population
    query = tuple(range(k)) if scope == "selected" else attrs
    ordered = tuple(sorted(query))
    axes = [ordered.index(q) for q in query]  # answer axes -> features..., label

    test_X = population.codes[np.ix_(test, np.asarray(attrs[:-1], dtype=np.int64))]
    test_y = population.codes[test, attrs[-1]]

    t0 = time.perf_counter()
    release = mechanism.run(train_pop, eps, k, method)
    table = np.transpose(np.asarray(release.answer(ordered), dtype=np.float64), axes)
    synthetic = sample_records(table, train_pop.n, method)
    error = misclassification(synthetic[:, :-1], synthetic[:, -1], test_X, test_y, method)
    seconds = time.perf_counter() - t0

    real_X = train_codes[:, list(query[:-1])]
    real_y = train_codes[:, query[-1]]
    nonoise = misclassification(real_X, real_y, test_X, test_y, gen)
    majority_label = int(np.argmax(np.bincount(real_y.astype(np.int64))))
    majority = float(np.mean(test_y != majority_label))
    return ClassificationRep(error, nonoise, majority, seconds, release.describe())
