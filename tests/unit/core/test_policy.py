"""Unit and property tests for candle_ckpt.core.policy."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from candle_ckpt.core.policy import BestState, is_improvement, resolve_mode
from candle_ckpt.core.retention import KeepExponential, KeepLatest, prune_plan, retention_policy

# ---------------------------------------------------------------------------
# resolve_mode
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "metric",
    [
        "val_accuracy",
        "accuracy",
        "acc",
        "val_acc",
        "auc",
        "val_auc",
        "prc",
        "precision",
        "recall",
        "f1",
        "f1_score",
        "fbeta_score",
        "iou",
        "mean_iou",
        "r2",
        "val_r2_score",
        "sparse_categorical_accuracy",
        "val_top_k_categorical_accuracy",
        "binary_acc",
        "pr_auc",
        "Val_Accuracy",
    ],
)
def test_resolve_mode_auto_higher_is_better(metric: str) -> None:
    """Auto mode resolves "higher is better" metric names to max."""
    assert resolve_mode(metric, "auto") == "max"


@pytest.mark.parametrize(
    "metric",
    [
        "loss",
        "val_loss",
        "mse",
        "val_mae",
        "mean_squared_error",
        "categorical_crossentropy",
        "accuracy_loss",
        "precision_at_recall_error",
    ],
)
def test_resolve_mode_auto_lower_is_better(metric: str) -> None:
    """Auto mode resolves every other metric name to min."""
    assert resolve_mode(metric, "auto") == "min"


@pytest.mark.parametrize("mode", ["min", "max"])
def test_resolve_mode_explicit_is_returned(mode: str) -> None:
    """An explicit min/max mode is returned unchanged regardless of the metric."""
    assert resolve_mode("val_accuracy", mode) == mode
    assert resolve_mode("val_loss", mode) == mode


@pytest.mark.parametrize("mode", ["best", "", "minimum", "increase"])
def test_resolve_mode_rejects_unknown_mode(mode: str) -> None:
    """An unknown mode raises ValueError naming the config key and allowed values."""
    with pytest.raises(ValueError, match=r"ckpt_save_best_mode.*auto, min, max"):
        resolve_mode("val_loss", mode)


# ---------------------------------------------------------------------------
# is_improvement
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("value", [0.0, -3.5, 1e9, 0.25])
def test_is_improvement_first_finite_value_improves(mode: str, value: float) -> None:
    """With no best yet, any finite value is an improvement in either mode."""
    assert is_improvement(value, None, mode)


def test_is_improvement_min_mode() -> None:
    """In min mode only strictly smaller values improve."""
    assert is_improvement(0.4, 0.5, "min")
    assert not is_improvement(0.5, 0.5, "min")
    assert not is_improvement(0.6, 0.5, "min")


def test_is_improvement_max_mode() -> None:
    """In max mode only strictly larger values improve."""
    assert is_improvement(0.6, 0.5, "max")
    assert not is_improvement(0.5, 0.5, "max")
    assert not is_improvement(0.4, 0.5, "max")


def test_max_metric_improves_from_the_start_unlike_candle_inf_bug() -> None:
    """A max metric improves on its first value and later rises (no +inf start)."""
    state = BestState(metric="val_accuracy", mode=resolve_mode("val_accuracy", "auto"))
    state, improved = state.update(0.1, epoch=1)
    assert improved
    state, improved = state.update(0.2, epoch=2)
    assert improved
    assert (state.value, state.epoch) == (0.2, 2)
    assert not is_improvement(0.9, math.inf, "max")  # what CANDLE effectively did


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("best", [None, 0.5])
def test_is_improvement_nan_never_improves(mode: str, best: float | None) -> None:
    """A NaN current value never improves, even when there is no best yet."""
    assert not is_improvement(math.nan, best, mode)


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("current", [math.inf, -math.inf])
def test_is_improvement_infinite_never_improves(mode: str, current: float) -> None:
    """An infinite current value never improves."""
    assert not is_improvement(current, None, mode)
    assert not is_improvement(current, 0.5, mode)


def test_is_improvement_nan_best_is_treated_as_unset() -> None:
    """A NaN best does not block improvement forever."""
    assert is_improvement(1.0, math.nan, "min")
    assert is_improvement(1.0, math.nan, "max")


@pytest.mark.parametrize("mode", ["auto", "MIN", "up"])
def test_is_improvement_rejects_unresolved_mode(mode: str) -> None:
    """Only resolved min/max directions are accepted."""
    with pytest.raises(ValueError, match="'min' or 'max'"):
        is_improvement(0.1, 0.2, mode)


# ---------------------------------------------------------------------------
# BestState
# ---------------------------------------------------------------------------


def test_best_state_update_returns_new_state_when_improved() -> None:
    """update returns a new state with value and epoch on improvement."""
    state = BestState(metric="val_loss", mode="min")
    new, improved = state.update(0.3, epoch=4)
    assert improved
    assert new == BestState("val_loss", "min", 0.3, 4)
    assert state.value is None  # original unchanged


def test_best_state_update_returns_same_state_when_not_improved() -> None:
    """update returns the unchanged state and False when not improved."""
    state = BestState("val_loss", "min", 0.3, 4)
    new, improved = state.update(0.35, epoch=5)
    assert not improved
    assert new is state


def test_best_state_is_frozen() -> None:
    """BestState is immutable."""
    state = BestState("val_loss", "min")
    with pytest.raises(AttributeError, match="value"):
        state.value = 1.0  # type: ignore[misc]


def test_best_state_rejects_bad_mode() -> None:
    """Constructing a BestState with an unresolved mode fails."""
    with pytest.raises(ValueError, match="'min' or 'max'"):
        BestState("val_loss", "auto")


# ---------------------------------------------------------------------------
# keep policies: factory and examples
# ---------------------------------------------------------------------------


def test_keep_policy_factory() -> None:
    """retention_policy maps linear/exponential to the matching class and limit."""
    linear = retention_policy("linear", 3)
    exponential = retention_policy("exponential", 7)
    assert isinstance(linear, KeepLatest)
    assert linear.limit == 3
    assert isinstance(exponential, KeepExponential)
    assert exponential.limit == 7


def test_keep_policy_rejects_bad_mode() -> None:
    """An unknown keep mode raises ValueError naming ckpt_keep_mode."""
    with pytest.raises(ValueError, match="ckpt_keep_mode"):
        retention_policy("logarithmic", 3)


@pytest.mark.parametrize("mode", ["linear", "exponential"])
@pytest.mark.parametrize("limit", [0, -1, 2.0, True])
def test_keep_policy_rejects_bad_limit(mode: str, limit: object) -> None:
    """A limit below 1 (or not an int) raises ValueError naming ckpt_keep_limit."""
    with pytest.raises(ValueError, match="ckpt_keep_limit"):
        retention_policy(mode, limit)  # type: ignore[arg-type]


def test_keep_latest_example() -> None:
    """KeepLatest keeps the newest epochs plus present protected ones only."""
    policy = KeepLatest(3)
    assert policy.select([1, 2, 3, 4, 5, 6]) == {4, 5, 6}
    assert policy.select([1, 2, 3, 4, 5, 6], protected=[2, 99]) == {2, 4, 5, 6}
    assert policy.select([]) == set()
    assert policy.select([7]) == {7}


def test_keep_exponential_example_1_to_1000() -> None:
    """KeepExponential over 1..1000 keeps the newest epoch of each power-of-2 age band."""
    # Hand check of the rule: n = 1000, ages 1..999. Age 0 -> 1000. Band k covers
    # ages [2**k, 2**(k+1)); its newest member has age 2**k, so k = 0..9 keep
    # ages 1, 2, 4, ..., 512 -> epochs 999, 998, 996, 992, 984, 968, 936, 872,
    # 744, 488. Band 10 starts at age 1024 > 999, so it is empty. 11 epochs, which
    # equals floor(log2(999)) + 2 = 11.
    kept = KeepExponential(100).select(range(1, 1001))
    assert kept == {1000, 999, 998, 996, 992, 984, 968, 936, 872, 744, 488}


def test_keep_exponential_limit_drops_oldest() -> None:
    """When over the limit, KeepExponential drops the oldest band representatives."""
    assert KeepExponential(4).select(range(1, 1001)) == {1000, 999, 998, 996}
    assert KeepExponential(1).select(range(1, 1001)) == {1000}


def test_keep_exponential_protected_and_empty() -> None:
    """KeepExponential adds present protected epochs and ignores absent ones."""
    assert KeepExponential(2).select(range(1, 101), protected=[3, 500]) == {100, 99, 3}
    assert KeepExponential(5).select([]) == set()
    assert KeepExponential(5).select([], protected=[1]) == set()


def test_keep_exponential_sparse_input() -> None:
    """KeepExponential bands are measured by age from the newest epoch, not by index."""
    # n = 20; ages: 10 -> 10 (band 3), 15 -> 5 (band 2), 17 -> 3 (band 1),
    # 18 -> 2 (band 1, newer than 17), 1 -> 19 (band 4), 5 -> 15 (band 3, older than 10).
    assert KeepExponential(50).select([1, 5, 10, 15, 17, 18, 20]) == {20, 18, 15, 10, 1}


def test_prune_plan() -> None:
    """prune_plan returns sorted, disjoint keep and delete lists covering the input."""
    keep, delete = prune_plan([5, 1, 3, 2, 4, 4], KeepLatest(2).select, protected=[1, 42])
    assert keep == [1, 4, 5]
    assert delete == [2, 3]


def test_prune_plan_empty() -> None:
    """prune_plan on no epochs keeps and deletes nothing."""
    assert prune_plan([], KeepExponential(3).select) == ([], [])


# ---------------------------------------------------------------------------
# keep policies: properties
# ---------------------------------------------------------------------------

_POLICIES = {"linear": KeepLatest, "exponential": KeepExponential}


@st.composite
def _keep_case(draw: st.DrawFn) -> tuple[set[int], int, set[int]]:
    """Draw (epochs, limit, protected) with protected partly inside the input."""
    epochs = draw(st.sets(st.integers(0, 5000), max_size=300))
    limit = draw(st.integers(1, 50))
    inside = draw(st.sets(st.sampled_from(sorted(epochs)))) if epochs else set()
    outside = draw(st.sets(st.integers(0, 5000), max_size=3))
    return epochs, limit, inside | outside


_property = settings(max_examples=200, deadline=None)


@pytest.mark.parametrize("mode", ["linear", "exponential"])
@_property
@given(case=_keep_case())
def test_keep_policy_properties(mode: str, case: tuple[set[int], int, set[int]]) -> None:
    """Keep policies return a subset holding the newest and protected epochs, within bound."""
    epochs, limit, protected = case
    policy = _POLICIES[mode](limit)
    kept = policy.select(epochs, protected)
    present_protected = protected & epochs

    assert kept <= epochs
    assert present_protected <= kept
    if epochs:
        assert max(epochs) in kept
    if mode == "linear":
        bound = limit + len(present_protected)
        assert kept == set(sorted(epochs)[-limit:]) | present_protected
    else:
        span = max(epochs) - min(epochs) if epochs else 0
        bound = min(limit, math.floor(math.log2(span or 1)) + 2) + len(present_protected)
    assert len(kept) <= bound


@pytest.mark.parametrize("mode", ["linear", "exponential"])
@_property
@given(case=_keep_case())
def test_keep_policy_idempotent(mode: str, case: tuple[set[int], int, set[int]]) -> None:
    """Pruning twice gives the same result as pruning once."""
    epochs, limit, protected = case
    policy = _POLICIES[mode](limit)
    once = policy.select(epochs, protected)
    assert policy.select(once, protected) == once


@pytest.mark.parametrize("mode", ["linear", "exponential"])
@_property
@given(case=_keep_case())
def test_prune_plan_partitions_input(mode: str, case: tuple[set[int], int, set[int]]) -> None:
    """prune_plan splits the input into sorted keep/delete lists matching select."""
    epochs, limit, protected = case
    policy = _POLICIES[mode](limit)
    keep, delete = prune_plan(list(epochs), policy.select, protected)
    assert keep == sorted(keep)
    assert delete == sorted(delete)
    assert set(keep) == policy.select(epochs, protected)
    assert set(keep).isdisjoint(delete)
    assert set(keep) | set(delete) == epochs


@pytest.mark.parametrize("mode", ["linear", "exponential"])
@_property
@given(case=_keep_case(), cut=st.integers(0, 5000))
def test_prune_plan_retains_the_current_lineage_first(
    mode: str, case: tuple[set[int], int, set[int]], cut: int
) -> None:
    """With the epochs above ``cut`` abandoned by a rollback, prune_plan keeps what the rule keeps of the current
    lineage alone, protected epochs wherever they are, and an abandoned epoch only once the lineage is kept in
    full (linear) or the rule left room (within its limit); pruning twice is pruning once."""
    epochs, limit, protected = case
    policy = _POLICIES[mode](limit)
    abandoned = {e for e in epochs if e > cut}
    ours = epochs - abandoned
    keep, delete = prune_plan(list(epochs), policy.select, protected, abandoned)
    assert set(keep) | set(delete) == epochs and set(keep).isdisjoint(delete)
    assert protected & epochs <= set(keep)
    assert policy.select(ours, protected & ours) <= set(keep)
    extra = (set(keep) & abandoned) - protected
    assert len(extra) + len(policy.select(ours, ())) <= limit
    if mode == "linear" and extra:
        assert ours <= set(keep)
    if not abandoned:
        assert (keep, delete) == prune_plan(list(epochs), policy.select, protected)
    assert prune_plan(keep, policy.select, protected, abandoned) == (keep, [])


def test_every_keep_mode_of_the_schema_has_a_rule() -> None:
    """The schema's ckpt_keep_mode choices (also the CLI's --keep-mode) and the keep rules name the same modes."""
    from candle_ckpt.config.checkpoint_keys import KEEP_MODES
    from candle_ckpt.core.retention import _RULES, retention_policy

    assert set(_RULES) == set(KEEP_MODES)
    assert {type(retention_policy(mode, 3)).__name__ for mode in KEEP_MODES} == {
        "KeepLatest",
        "KeepExponential",
        "KeepAll",
    }
