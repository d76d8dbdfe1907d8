"""The classification experiment (the CALM paper, Zhang et al., CCS 2018, §5.4, Fig. 6):
sampling a synthetic dataset from a marginal, the SVM's error, and one repetition of the
protocol with NoNoise and Majority. Bounds come from binomial sampling of the test split
(and Pearson's chi-square for sampling), with the Bonferroni alpha of tests/stats.py."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from calmkit_client import CalmkitError, Schema
from calmkit_client.randomness import RngLike
from calmkit_simulator import Population, synthetic_population
from calmkit_simulator.classify import (
    ADULT_FEATURES,
    ADULT_LABEL,
    SVM_OPTIONS,
    ClassificationError,
    ClassificationSetting,
    acs_setting,
    adult_binary_setting,
    adult_setting,
    misclassification,
    mutual_information,
    run_classification,
    sample_records,
    svm_predict,
    top_features,
)
from calmkit_simulator.mechanisms import Calm, Mechanism, NotScalable, Release
from tests.simulator.mechs import Refuses
from tests.stats import assert_chisquare, z_bound

FLIP = 0.1  # label noise: the Bayes classifier's error on the labelled populations
N = 20_000
N_TEST = 4_000  # round(0.2 * N)


def labelled(n: int = N, flip: float = FLIP, rng: int = 2) -> Population:
    """Five features from a synthetic Bayesian network (sizes 3, 2, 3, 2, 2) and a label
    ``[x0 == 1] + [x2 == 1] + x1 >= 2`` flipped with probability ``flip``. The rule is
    linear in the one-hot encoding but not in the raw codes (x0, x2 are non-monotone),
    so the Bayes classifier is a linear SVM's and its error is exactly ``flip``."""
    feats = synthetic_population(n=n, sizes=(3, 2, 3, 2, 2), strength=0.5, rng=rng)
    x = feats.codes.astype(np.int64)
    rule = ((x[:, 0] == 1).astype(np.int64) + (x[:, 2] == 1) + x[:, 1]) >= 2
    flips = np.random.default_rng(rng + 1000).random(n) < flip
    y = (rule ^ flips).astype(np.int64)
    return Population(Schema.from_sizes((3, 2, 3, 2, 2, 2)), np.column_stack([x, y]), "labelled")


def binomial_bound(p: float, n: int, copies: int = 1) -> float:
    """Bonferroni z times the sd of (a difference of ``copies``) test error rates."""
    return z_bound(1) * float(np.sqrt(copies * p * (1 - p) / n))


class _Exact(Release):
    def __init__(self, population: Population) -> None:
        self.population = population

    def answer(self, attrs: Sequence[int]) -> np.ndarray:
        return self.population.marginal(attrs)


class _Oracle(Mechanism):
    """Releases the true marginals of the population it is given (no noise)."""

    name = "oracle"
    privacy_unit = "none: the exact marginals (test reference)"

    def __init__(self) -> None:
        self.seen: list[Population] = []

    def run(self, population: Population, epsilon: float, k: int, rng: RngLike = None) -> Release:
        self.seen.append(population)
        return _Exact(population)


# -- sample_records ----------------------------------------------------------------------------
def test_sample_records_fits_the_table() -> None:
    """Catches a wrong axis order (non-square shape), missing renormalisation (the
    table sums to 2.5) or a bias in the draw."""
    gen = np.random.default_rng(7)
    table = 2.5 * gen.dirichlet(np.ones(24)).reshape(3, 2, 4)
    n = 50_000
    codes = sample_records(table, n, rng=1)
    assert codes.shape == (n, 3) and codes.dtype == np.int64
    cells = np.ravel_multi_index(tuple(codes.T), table.shape)
    observed = np.bincount(cells, minlength=table.size)
    assert_chisquare(observed, n * table.ravel() / table.sum())


def test_sample_records_clips_negative_cells() -> None:
    table = np.array([[0.5, -0.2], [0.4, 0.3]])
    n = 30_000
    codes = sample_records(table, n, rng=2)
    observed = np.bincount(np.ravel_multi_index(tuple(codes.T), table.shape), minlength=4)
    assert observed[1] == 0  # the negative cell is never drawn
    kept = np.array([0, 2, 3])
    assert_chisquare(observed[kept], n * table.ravel()[kept] / 1.2)  # renormalised over 1.2


def test_sample_records_edge_shapes() -> None:
    assert sample_records(np.array([0.2, 0.8]), 0, rng=0).shape == (0, 1)
    assert sample_records(np.array([0.0, 1.0]), 5, rng=0).tolist() == [[1]] * 5


@pytest.mark.parametrize(
    "table",
    [np.zeros((2, 3)), -np.ones(4), np.array([0.5, np.nan]), np.zeros(0)],
    ids=["zeros", "negative", "nan", "empty"],
)
def test_sample_records_rejects_tables_without_mass(table: np.ndarray) -> None:
    with pytest.raises(ClassificationError, match=r"table \("):
        sample_records(table, 10, rng=0)


def test_sample_records_rejects_bad_n() -> None:
    with pytest.raises(ClassificationError, match=r"n \(-1\)"):
        sample_records(np.ones(3), -1)


# -- the SVM -------------------------------------------------------------------------------------
def _split(pop: Population) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    x, y = pop.codes[:, :-1], pop.codes[:, -1]
    return x[N_TEST:], y[N_TEST:], x[:N_TEST], y[:N_TEST]  # records are i.i.d.: any split


def test_deterministic_label_is_learned_exactly() -> None:
    """The label is a one-hot-linear function of the features: zero test error (fails
    if the features are fed as raw codes, or labels are misaligned)."""
    assert misclassification(*_split(labelled(flip=0.0))) == 0.0


def test_independent_label_gives_the_base_rate() -> None:
    """A label independent of the features (P(1) = 0.2): the SVM predicts the majority
    class, so the error is the test split's share of 1s, binomial around 0.2."""
    pop = labelled()
    y = (np.random.default_rng(5).random(N) < 0.2).astype(np.int64)
    train_X, _, test_X, _ = _split(pop)
    error = misclassification(train_X, y[N_TEST:], test_X, y[:N_TEST])
    assert abs(error - 0.2) <= binomial_bound(0.2, N_TEST)
    assert error == pytest.approx(float(np.mean(y[:N_TEST] == 1)), abs=0)


def test_single_training_class_is_predicted() -> None:
    test_y = np.array([0, 1, 1, 2])
    error = misclassification(np.zeros((3, 2), int), np.ones(3, int), np.zeros((4, 2), int), test_y)
    assert error == 0.5


def test_merged_rows_train_the_svm_of_the_raw_rows() -> None:
    """Merging identical rows with sample weights must give the raw-row SVM's
    predictions (catches weights misaligned with rows)."""
    from sklearn.preprocessing import OneHotEncoder
    from sklearn.svm import LinearSVC

    train_X, train_y, test_X, _ = _split(labelled(n=8000, flip=0.25, rng=3))
    train_X, train_y = train_X[:3000], train_y[:3000]
    encoder = OneHotEncoder(handle_unknown="ignore").fit(train_X)
    raw = LinearSVC(**SVM_OPTIONS).fit(encoder.transform(train_X), train_y)
    expected = raw.predict(encoder.transform(test_X))
    np.testing.assert_array_equal(svm_predict(train_X, train_y, test_X, rng=0), expected)


def test_svm_rejects_mismatched_inputs() -> None:
    with pytest.raises(ClassificationError, match=r"test_X \(3 columns\)"):
        misclassification(np.zeros((4, 2)), np.arange(4), np.zeros((2, 3)), np.zeros(2))
    with pytest.raises(ClassificationError, match=r"train_y \(shape \(3,\)\)"):
        misclassification(np.zeros((4, 2)), np.arange(3), np.zeros((2, 2)), np.zeros(2))


def test_missing_scikit_learn_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sklearn.svm", None)  # import fails as if absent
    train_X, train_y, test_X, test_y = _split(labelled(n=5000))
    with pytest.raises(ClassificationError, match=r'pip install "calmkit\[figures\]"'):
        misclassification(train_X, train_y, test_X, test_y)


# -- one repetition ------------------------------------------------------------------------------
SETTING = ClassificationSetting(labelled(), (0, 1, 2, 3, 4), 5, "labelled")


@pytest.mark.parametrize("duplicate", [1, 4])
def test_oracle_release_matches_nonoise_and_majority_is_exact(duplicate: int) -> None:
    """The exact training marginal: its synthetic sample teaches the same rule, so
    both errors are binomial around FLIP; Majority is the test split's share of the
    training minority label, computed from what the mechanism saw."""
    pop, oracle = SETTING.population, _Oracle()
    rep = run_classification(pop, SETTING, oracle, 1.0, rng=11, duplicate=duplicate)
    (seen,) = oracle.seen
    n_train = N - N_TEST
    assert seen.n == duplicate * n_train and seen.d == 6
    train_counts = seen.counts([5])
    assert np.all(train_counts % duplicate == 0)  # every training user tiled
    test_counts = pop.counts([5]) - train_counts // duplicate
    minority = 1 - int(np.argmax(train_counts))
    assert rep.majority == test_counts[minority] / N_TEST
    assert abs(rep.nonoise - FLIP) <= binomial_bound(FLIP, N_TEST)
    assert abs(rep.error - FLIP) <= binomial_bound(FLIP, N_TEST)
    assert abs(rep.error - rep.nonoise) <= binomial_bound(FLIP, N_TEST, copies=2)
    assert rep.seconds > 0 and rep.chosen == {}


@pytest.mark.parametrize("scope", ["selected", "all"])
def test_attribute_order_is_followed(scope: str) -> None:
    """Features and label at unsorted positions among extra attributes: the released
    table must be transposed back to features..., label (else the SVM learns from the
    wrong columns and the error is far from FLIP)."""
    base = labelled()
    noise = np.random.default_rng(9).integers(0, 3, N)
    # columns: label, x2, noise, x0, x4, x1, x3
    codes = np.column_stack(
        [
            base.codes[:, 5],
            base.codes[:, 2],
            noise,
            *base.codes[:, [0, 4]].T,
            base.codes[:, 1],
            base.codes[:, 3],
        ]
    )
    pop = Population(Schema.from_sizes((2, 3, 3, 3, 2, 2, 2)), codes, "shuffled")
    setting = ClassificationSetting(pop, (3, 5, 1, 6, 4), 0)
    oracle = _Oracle()
    rep = run_classification(pop, setting, oracle, 1.0, rng=12, scope=scope)
    assert oracle.seen[0].d == (6 if scope == "selected" else 7)
    assert abs(rep.error - FLIP) <= binomial_bound(FLIP, N_TEST)
    assert abs(rep.nonoise - FLIP) <= binomial_bound(FLIP, N_TEST)


def test_calm_at_epsilon_4_is_well_below_majority() -> None:
    """CALM (LDP, eps = 4, 16,000 users) on a strongly label-dependent population:
    significantly below Majority (binomial bound on the difference) and at least half
    way from Majority to NoNoise."""
    rep = run_classification(SETTING.population, SETTING, Calm(), 4.0, rng=13)
    m = rep.majority
    assert rep.error <= m - binomial_bound(m, N_TEST, copies=2)
    assert rep.error <= (m + rep.nonoise) / 2
    assert {"m", "l"} <= set(rep.chosen)


def test_not_scalable_propagates_before_any_work() -> None:
    mech = Refuses()
    with pytest.raises(NotScalable, match=r"n \(64000\)"):  # 4 x the 16,000 training users
        run_classification(SETTING.population, SETTING, mech, 1.0, duplicate=4)
    assert not mech.ran


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"epsilon": 0.0}, r"epsilon \(0.0\)"),
        ({"duplicate": 0}, r"duplicate \(0\)"),
        ({"test_fraction": 1.0}, r"test_fraction \(1.0\)"),
        ({"scope": "some"}, r"scope \('some'\)"),
    ],
)
def test_run_classification_rejects_bad_arguments(options: dict[str, object], match: str) -> None:
    kwargs: dict[str, object] = {"epsilon": 1.0, **options}
    with pytest.raises(CalmkitError, match=match):
        run_classification(SETTING.population, SETTING, _Oracle(), **kwargs)  # type: ignore[arg-type]


def test_population_must_match_the_setting() -> None:
    other = Population(
        Schema.from_sizes((3, 2, 3, 2, 2, 2), names=list("abcdef")), SETTING.population.codes
    )
    with pytest.raises(ClassificationError, match=r"attribute 'a0' at position 0"):
        run_classification(other, SETTING, _Oracle(), 1.0)


@pytest.mark.parametrize(
    ("features", "label", "match"),
    [
        ((0, 1), 1, r"label \(1\)"),
        ((0, 0), 5, r"features \(\[0, 0\]\)"),
        ((0, 9), 5, r"\(9\)"),
        ((), 5, r"features \(\(\)\)"),
    ],
)
def test_setting_validation(features: tuple[int, ...], label: int, match: str) -> None:
    with pytest.raises(ClassificationError, match=match):
        ClassificationSetting(SETTING.population, features, label)


def test_mutual_information_identities() -> None:
    pop = SETTING.population
    p = pop.marginal([0])
    entropy = -float((p * np.log(p)).sum())
    assert mutual_information(pop, 0, 0) == pytest.approx(entropy, rel=1e-12)
    assert mutual_information(pop, 0, 5) == pytest.approx(mutual_information(pop, 5, 0), rel=1e-12)
    # the label depends on x0, x1, x2 only: those carry the most information about it
    assert set(top_features(pop, 5, 3)) == {0, 1, 2}


# -- real data ------------------------------------------------------------------------------------
def test_adult_presets_and_nonoise_beats_majority(datasets_dir: Path) -> None:
    setting = adult_setting(datasets_dir)
    assert setting.feature_names == ADULT_FEATURES and setting.label_name == ADULT_LABEL
    assert max(setting.population.schema.sizes) == 3
    binary = adult_binary_setting(datasets_dir)
    assert binary.feature_names == ADULT_FEATURES and set(binary.population.schema.sizes) == {2}
    pop = setting.population
    rep = run_classification(pop, setting, _Oracle(), 1.0, rng=0)
    assert rep.nonoise < rep.majority
    # paired test on one split: per-record difference of the two 0/1 losses
    gen = np.random.default_rng(1)
    order = gen.permutation(pop.n)
    n_test = round(0.2 * pop.n)
    test, train = order[:n_test], order[n_test:]
    x, y = pop.codes[:, list(setting.features)], pop.codes[:, setting.label]
    predicted = svm_predict(x[train], y[train], x[test], gen)
    majority = np.argmax(np.bincount(y[train]))
    diff = (predicted != y[test]).astype(float) - (majority != y[test])
    assert diff.mean() <= -z_bound(1) * diff.std(ddof=1) / np.sqrt(n_test)


def test_acs_preset_is_balanced_label_and_most_informative_features(datasets_dir: Path) -> None:
    setting = acs_setting(datasets_dir)
    pop = setting.population
    share = pop.marginal([setting.label])
    assert all(share.max() <= pop.marginal([j]).max() for j in range(pop.d))
    mi = {j: mutual_information(pop, j, setting.label) for j in range(pop.d) if j != setting.label}
    chosen = [mi[j] for j in setting.features]
    assert chosen == sorted(chosen, reverse=True) and len(setting.features) == 5
    assert min(chosen) >= max(v for j, v in mi.items() if j not in setting.features)
