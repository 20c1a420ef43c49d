"""Unit tests for candle_ckpt.config.params."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import numbers
import pathlib
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from candle_ckpt.config.cli_args import ckpt_defs, ckpt_parser, str2bool, str2bool_or_auto
from candle_ckpt.config.params import CkptConfig
from candle_ckpt.config.schema import CKPT_KEYS, SPECS

EXPECTED_DEFAULTS: dict[str, Any] = {
    "restart_mode": "auto",
    "save_best": True,
    "save_best_metric": "val_loss",
    "save_best_mode": "auto",
    "skip_epochs": 0,
    "save_interval": 1,
    "checksum": True,
    "keep_mode": "linear",
    "keep_limit": 1_000_000,
    "directory": "./save",
    "metadata": None,
    "save_weights_only": False,
    "restart_epoch": None,
    "max_no_progress_restarts": 3,
    "on_error": "raise",
    "async_save": None,
    "async_timeout": 600.0,
    "upload_url": None,
    "upload_mode": "every",
    "upload_options": None,
    "persistent_url": None,
    "drain": None,
    "drain_interval": 5,
    "drain_timeout": 25.0,
    "best_metric_last": None,
    "layout": "nested",
    "compile_cache": "auto",
    "save_steps": "auto",
    "mtbf": "auto",
    "preempt_signals": ("SIGTERM",),
    "preempt_exit_code": "signal",
    "deadline": "auto",
    "deadline_margin": 60.0,
    "hang_timeout": "auto",
    "preempt_check": 1,
    "epochs": None,
}

FIELD_FOR_KEY: dict[str, str] = {
    "ckpt_restart_mode": "restart_mode",
    "ckpt_save_best": "save_best",
    "ckpt_save_best_metric": "save_best_metric",
    "ckpt_save_best_mode": "save_best_mode",
    "ckpt_skip_epochs": "skip_epochs",
    "ckpt_save_interval": "save_interval",
    "ckpt_checksum": "checksum",
    "ckpt_keep_mode": "keep_mode",
    "ckpt_keep_limit": "keep_limit",
    "ckpt_directory": "directory",
    "ckpt_metadata": "metadata",
    "ckpt_save_weights_only": "save_weights_only",
    "ckpt_restart_epoch": "restart_epoch",
    "ckpt_max_no_progress_restarts": "max_no_progress_restarts",
    "ckpt_on_error": "on_error",
    "ckpt_async": "async_save",
    "ckpt_async_timeout": "async_timeout",
    "ckpt_upload_url": "upload_url",
    "ckpt_upload_mode": "upload_mode",
    "ckpt_upload_options": "upload_options",
    "ckpt_persistent_url": "persistent_url",
    "ckpt_drain": "drain",
    "ckpt_drain_interval": "drain_interval",
    "ckpt_drain_timeout": "drain_timeout",
    "ckpt_best_metric_last": "best_metric_last",
    "ckpt_layout": "layout",
    "ckpt_compile_cache": "compile_cache",
    "ckpt_save_steps": "save_steps",
    "ckpt_mtbf": "mtbf",
    "ckpt_preempt_signals": "preempt_signals",
    "ckpt_preempt_exit_code": "preempt_exit_code",
    "ckpt_deadline": "deadline",
    "ckpt_deadline_margin": "deadline_margin",
    "ckpt_hang_timeout": "hang_timeout",
    "ckpt_preempt_check": "preempt_check",
    "epochs": "epochs",
}
CKPT_ONLY_KEYS = [key for key in CKPT_KEYS if key.startswith("ckpt_")]
BOOL_KEYS = ["ckpt_save_best", "ckpt_checksum", "ckpt_save_weights_only", "ckpt_async"]
INT_KEYS = [
    "ckpt_skip_epochs",
    "ckpt_save_interval",
    "ckpt_keep_limit",
    "ckpt_restart_epoch",
    "ckpt_max_no_progress_restarts",
    "ckpt_save_steps",
    "epochs",
]
CHOICE_KEYS = {
    "ckpt_restart_mode": ("off", "auto", "required"),
    "ckpt_save_best_mode": ("auto", "min", "max"),
    "ckpt_keep_mode": ("linear", "exponential", "all"),
    "ckpt_layout": ("nested", "flat"),
    "ckpt_on_error": ("raise", "warn"),
    "ckpt_upload_mode": ("every", "end"),
    "ckpt_drain": ("every", "interval", "preempt", "end"),
}


def key_pattern(key: str) -> str:
    """Return a regex matching ``key`` literally."""
    return re.escape(key)


class Unprintable:
    """An object whose ``__str__`` and ``__repr__`` both raise."""

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class BadPath:
    """An os.PathLike whose ``__fspath__`` raises."""

    def __fspath__(self) -> str:
        raise RuntimeError("no path")


class BytesPath:
    """An os.PathLike whose ``__fspath__`` returns bytes."""

    def __fspath__(self) -> bytes:
        return b"/tmp"

    def __repr__(self) -> str:
        return "BytesPath()"


class WeirdInt(int):
    """An int subclass whose ``__index__`` raises."""

    def __index__(self) -> int:
        raise RuntimeError("no index")


class HostileIntegral:
    """An object registered as numbers.Integral whose ``__index__`` raises."""

    def __index__(self) -> int:
        raise RuntimeError("no index")

    def __repr__(self) -> str:
        return "HostileIntegral()"


numbers.Integral.register(HostileIntegral)


class SneakyStr(str):
    """A str subclass whose ``strip``/``lower``/``__str__`` misbehave."""

    __slots__ = ()

    def strip(self, chars: str | None = None) -> str:
        raise RuntimeError("no strip")

    def lower(self) -> str:
        raise RuntimeError("no lower")

    def __str__(self) -> str:
        raise RuntimeError("no str")


# --------------------------------------------------------------------------
# Defaults and module constants
# --------------------------------------------------------------------------


def test_defaults_from_empty_dict() -> None:
    """An empty gParameters dict yields every documented default."""
    config = CkptConfig.from_params({})
    assert dataclasses.asdict(config) == EXPECTED_DEFAULTS


def test_default_constructor_matches_from_params() -> None:
    """CkptConfig() equals CkptConfig.from_params({})."""
    assert CkptConfig() == CkptConfig.from_params({})


def test_default_types_are_exact() -> None:
    """Defaults have the documented Python types (float timeout, int limit)."""
    config = CkptConfig()
    assert type(config.async_timeout) is float
    assert type(config.keep_limit) is int
    assert type(config.save_best) is bool


def test_ckpt_keys_lists_every_key_read() -> None:
    """CKPT_KEYS holds all ckpt_* keys plus epochs and metadata, without repeats."""
    expected_ckpt = {
        "ckpt_restart_mode",
        "ckpt_save_best",
        "ckpt_save_best_metric",
        "ckpt_save_best_mode",
        "ckpt_skip_epochs",
        "ckpt_save_interval",
        "ckpt_checksum",
        "ckpt_keep_mode",
        "ckpt_keep_limit",
        "ckpt_directory",
        "ckpt_metadata",
        "ckpt_save_weights_only",
        "ckpt_restart_epoch",
        "ckpt_max_no_progress_restarts",
        "ckpt_on_error",
        "ckpt_async",
        "ckpt_async_timeout",
        "ckpt_upload_url",
        "ckpt_upload_mode",
        "ckpt_upload_options",
        "ckpt_persistent_url",
        "ckpt_drain",
        "ckpt_drain_interval",
        "ckpt_drain_timeout",
        "ckpt_best_metric_last",
        "ckpt_layout",
        "ckpt_compile_cache",
        "ckpt_save_steps",
        "ckpt_mtbf",
        "ckpt_preempt_signals",
        "ckpt_preempt_exit_code",
        "ckpt_deadline",
        "ckpt_deadline_margin",
        "ckpt_hang_timeout",
        "ckpt_preempt_check",
    }
    assert isinstance(CKPT_KEYS, tuple)
    assert len(CKPT_KEYS) == len(set(CKPT_KEYS))
    assert set(CKPT_KEYS) == expected_ckpt | {"epochs", "metadata"}


def test_unknown_keys_are_ignored() -> None:
    """Keys unrelated to checkpointing do not affect the configuration."""
    params = {"batch_size": [1, 2], "learning_rate": object(), "ckpt_bogus": "x"}
    assert CkptConfig.from_params(params) == CkptConfig()


def test_none_value_means_default_for_non_optional_keys() -> None:
    """A key present with value None takes its default, as if it were missing."""
    params = {key: None for key in CKPT_KEYS}
    assert CkptConfig.from_params(params) == CkptConfig()


def test_non_mapping_params_rejected() -> None:
    """Passing something other than a mapping raises TypeError."""
    with pytest.raises(TypeError, match="mapping"):
        CkptConfig.from_params(argparse.Namespace(ckpt_save_best=True))  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# Coercion of valid values
# --------------------------------------------------------------------------


def test_string_values_are_coerced() -> None:
    """String values from config files are converted to the field types."""
    config = CkptConfig.from_params(
        {
            "ckpt_save_best": "True",
            "ckpt_skip_epochs": "3",
            "ckpt_save_interval": " 2 ",
            "ckpt_async_timeout": "0.5",
            "ckpt_restart_epoch": "None",
            "ckpt_keep_limit": "10",
            "epochs": "20",
        }
    )
    assert config.save_best is True
    assert config.skip_epochs == 3
    assert config.save_interval == 2
    assert config.async_timeout == 0.5
    assert config.restart_epoch is None
    assert config.keep_limit == 10
    assert config.epochs == 20


@pytest.mark.parametrize(
    "text",
    ["true", "TRUE", "True", "1", "yes", "Yes", "on", "ON", "t", "T", "y", " y "],
)
@pytest.mark.parametrize("key", BOOL_KEYS)
def test_true_strings(key: str, text: str) -> None:
    """Every accepted spelling of true coerces to True for every bool key."""
    field = FIELD_FOR_KEY[key]
    assert getattr(CkptConfig.from_params({key: text}), field) is True


@pytest.mark.parametrize("text", ["false", "FALSE", "False", "0", "no", "NO", "off", "Off", "f", "n", " n "])
@pytest.mark.parametrize("key", BOOL_KEYS)
def test_false_strings(key: str, text: str) -> None:
    """Every accepted spelling of false coerces to False for every bool key."""
    field = FIELD_FOR_KEY[key]
    assert getattr(CkptConfig.from_params({key: text}), field) is False


@pytest.mark.parametrize(("value", "expected"), [(True, True), (False, False), (1, True), (0, False)])
def test_bool_accepts_bools_and_zero_one(value: object, expected: bool) -> None:
    """Bool keys accept real booleans and the integers 0 and 1."""
    assert CkptConfig.from_params({"ckpt_checksum": value}).checksum is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(3, 3), ("3", 3), (" 3 ", 3), ("+4", 4), (3.0, 3), ("3.0", 3), ("1e3", 1000)],
)
def test_int_coercion(value: object, expected: int) -> None:
    """Int keys accept ints, integral floats and numeric strings."""
    config = CkptConfig.from_params({"ckpt_skip_epochs": value})
    assert config.skip_epochs == expected
    assert type(config.skip_epochs) is int


def test_huge_int_is_accepted_when_in_range() -> None:
    """A very large integer is a valid keep limit (there is no upper bound)."""
    assert CkptConfig.from_params({"ckpt_keep_limit": 10**400}).keep_limit == 10**400


@pytest.mark.parametrize(
    ("value", "expected"),
    [(5, 5.0), (2.5, 2.5), ("0.5", 0.5), (" 7 ", 7.0), ("1e2", 100.0)],
)
def test_float_coercion(value: object, expected: float) -> None:
    """The timeout accepts ints, floats and numeric strings, stored as float."""
    config = CkptConfig.from_params({"ckpt_async_timeout": value})
    assert config.async_timeout == expected
    assert type(config.async_timeout) is float


@pytest.mark.parametrize(("key", "choices"), list(CHOICE_KEYS.items()))
def test_choice_keys_are_case_insensitive(key: str, choices: tuple[str, ...]) -> None:
    """Choice keys accept any case and surrounding whitespace, stored lower-case."""
    field = FIELD_FOR_KEY[key]
    for choice in choices:
        value = f"  {choice.upper()} "
        assert getattr(CkptConfig.from_params({key: value}), field) == choice


@pytest.mark.parametrize("none_like", [None, "None", "none", "NONE", "", "  "])
@pytest.mark.parametrize("key", ["ckpt_restart_epoch", "ckpt_metadata", "epochs"])
def test_optional_none_spellings(key: str, none_like: object) -> None:
    """Optional keys treat None, 'None', 'none' and '' as None."""
    field = FIELD_FOR_KEY[key]
    assert getattr(CkptConfig.from_params({key: none_like}), field) is None


def test_restart_epoch_zero_allowed() -> None:
    """ckpt_restart_epoch accepts 0 (restart from the initial state)."""
    assert CkptConfig.from_params({"ckpt_restart_epoch": "0"}).restart_epoch == 0


def test_save_interval_zero_allowed() -> None:
    """ckpt_save_interval accepts 0, which disables saving."""
    assert CkptConfig.from_params({"ckpt_save_interval": 0}).save_interval == 0


def test_directory_accepts_pathlike() -> None:
    """ckpt_directory accepts os.PathLike objects and stores them as str."""
    config = CkptConfig.from_params({"ckpt_directory": pathlib.Path("/tmp/ck")})
    assert config.directory == "/tmp/ck"
    assert type(config.directory) is str


def test_directory_kept_verbatim() -> None:
    """ckpt_directory is stored unchanged (paths are not stripped or resolved)."""
    assert CkptConfig.from_params({"ckpt_directory": "out dir/"}).directory == "out dir/"


def test_metric_is_stripped() -> None:
    """ckpt_save_best_metric loses surrounding whitespace but keeps its case."""
    config = CkptConfig.from_params({"ckpt_save_best_metric": " val_AUC "})
    assert config.save_best_metric == "val_AUC"


def test_str_subclass_hooks_are_bypassed() -> None:
    """A str subclass with hostile methods is read by its character content."""
    config = CkptConfig.from_params({"ckpt_keep_mode": SneakyStr("Exponential"), "ckpt_metadata": SneakyStr("m")})
    assert config.keep_mode == "exponential"
    assert type(config.metadata) is str
    assert config.metadata == "m"


# --------------------------------------------------------------------------
# metadata fallback
# --------------------------------------------------------------------------


def test_metadata_falls_back_to_candle_key() -> None:
    """Without ckpt_metadata, CANDLE's metadata key is used."""
    assert CkptConfig.from_params({"metadata": "job-42"}).metadata == "job-42"


@pytest.mark.parametrize("unset", [None, "None", ""])
def test_metadata_fallback_when_ckpt_metadata_none_like(unset: object) -> None:
    """A None-like ckpt_metadata also falls back to CANDLE's metadata key."""
    params = {"ckpt_metadata": unset, "metadata": "job-42"}
    assert CkptConfig.from_params(params).metadata == "job-42"


def test_ckpt_metadata_wins_over_metadata() -> None:
    """An explicit ckpt_metadata takes precedence over CANDLE's metadata."""
    params = {"ckpt_metadata": "mine", "metadata": "candle"}
    assert CkptConfig.from_params(params).metadata == "mine"


def test_invalid_metadata_fallback_names_metadata_key() -> None:
    """A non-string CANDLE metadata value raises TypeError naming 'metadata'."""
    with pytest.raises(TypeError, match=r"^metadata \(used because ckpt_metadata"):
        CkptConfig.from_params({"metadata": 17})


def test_invalid_metadata_ignored_when_ckpt_metadata_set() -> None:
    """CANDLE's metadata is not read at all when ckpt_metadata is set."""
    params = {"ckpt_metadata": "mine", "metadata": object()}
    assert CkptConfig.from_params(params).metadata == "mine"


# --------------------------------------------------------------------------
# Invalid values
# --------------------------------------------------------------------------

INVALID_CASES: list[tuple[str, object, type[Exception]]] = [
    # bools
    *[(key, "maybe", ValueError) for key in BOOL_KEYS],
    *[(key, 2, ValueError) for key in BOOL_KEYS],
    *[(key, -1, ValueError) for key in BOOL_KEYS],
    *[(key, 1.0, TypeError) for key in BOOL_KEYS],
    *[(key, [True], TypeError) for key in BOOL_KEYS],
    *[(key, b"true", TypeError) for key in BOOL_KEYS],
    # ints
    *[(key, True, TypeError) for key in INT_KEYS],
    *[(key, False, TypeError) for key in INT_KEYS],
    *[(key, "three", ValueError) for key in INT_KEYS],
    *[(key, 2.5, ValueError) for key in INT_KEYS],
    *[(key, "2.5", ValueError) for key in INT_KEYS],
    *[(key, math.nan, ValueError) for key in INT_KEYS],
    *[(key, math.inf, ValueError) for key in INT_KEYS],
    *[(key, [1], TypeError) for key in INT_KEYS],
    *[(key, b"1", TypeError) for key in INT_KEYS],
    *[(key, 1 + 0j, TypeError) for key in INT_KEYS],
    *[(key, -1, ValueError) for key in INT_KEYS],
    ("ckpt_skip_epochs", "", ValueError),
    ("ckpt_keep_limit", 0, ValueError),
    ("ckpt_keep_limit", "0", ValueError),
    ("epochs", 0, ValueError),
    ("ckpt_restart_epoch", -(10**5000), ValueError),
    ("ckpt_save_steps", "sometimes", ValueError),
    # auto or seconds
    ("ckpt_mtbf", True, TypeError),
    ("ckpt_mtbf", 0, ValueError),
    ("ckpt_mtbf", "never", ValueError),
    ("ckpt_mtbf", math.inf, ValueError),
    # float
    ("ckpt_async_timeout", True, TypeError),
    ("ckpt_async_timeout", 0, ValueError),
    ("ckpt_async_timeout", -1.5, ValueError),
    ("ckpt_async_timeout", "0", ValueError),
    ("ckpt_async_timeout", math.nan, ValueError),
    ("ckpt_async_timeout", math.inf, ValueError),
    ("ckpt_async_timeout", "nan", ValueError),
    ("ckpt_async_timeout", "inf", ValueError),
    ("ckpt_async_timeout", "soon", ValueError),
    ("ckpt_async_timeout", "", ValueError),
    ("ckpt_async_timeout", 10**400, ValueError),
    ("ckpt_async_timeout", [1.0], TypeError),
    ("ckpt_async_timeout", b"1", TypeError),
    # choices
    *[(key, "bogus", ValueError) for key in CHOICE_KEYS],
    *[(key, "", ValueError) for key in CHOICE_KEYS if key not in ("ckpt_layout", "ckpt_drain")],  # optional: "" is None
    *[(key, 1, TypeError) for key in CHOICE_KEYS],
    *[(key, False, TypeError) for key in CHOICE_KEYS],
    *[(key, ["auto"], TypeError) for key in CHOICE_KEYS],
    *[(key, b"auto", TypeError) for key in CHOICE_KEYS],
    # strings
    ("ckpt_save_best_metric", "", ValueError),
    ("ckpt_save_best_metric", "   ", ValueError),
    ("ckpt_save_best_metric", 3, TypeError),
    ("ckpt_save_best_metric", b"val_loss", TypeError),
    ("ckpt_directory", "", ValueError),
    ("ckpt_directory", " ", ValueError),
    ("ckpt_directory", "a\x00b", ValueError),
    ("ckpt_directory", 3, TypeError),
    ("ckpt_directory", b"/tmp", TypeError),
    ("ckpt_directory", BytesPath(), TypeError),
    ("ckpt_metadata", 3, TypeError),
    ("ckpt_metadata", b"meta", TypeError),
    ("ckpt_metadata", ["meta"], TypeError),
    ("metadata", 3.5, TypeError),
    # upload URL and options
    ("ckpt_upload_url", "bucket/job", ValueError),
    ("ckpt_upload_url", "/scratch/job", ValueError),
    ("ckpt_upload_url", "s3://", ValueError),
    ("ckpt_upload_url", 3, TypeError),
    ("ckpt_upload_url", b"s3://b", TypeError),
    ("ckpt_persistent_url", "s3://", ValueError),
    ("ckpt_persistent_url", "a\x00b", ValueError),
    ("ckpt_persistent_url", 3, TypeError),
    ("ckpt_drain", "sometimes", ValueError),
    ("ckpt_drain_interval", 0, ValueError),
    ("ckpt_drain_timeout", 0, ValueError),
    ("ckpt_upload_options", "{not json", ValueError),
    ("ckpt_upload_options", "[1, 2]", ValueError),
    ("ckpt_upload_options", 3, TypeError),
    ("ckpt_upload_options", {"key": object()}, TypeError),
    ("ckpt_best_metric_last", "nan", ValueError),
    ("ckpt_best_metric_last", "low", ValueError),
    ("ckpt_best_metric_last", True, TypeError),
    ("ckpt_best_metric_last", [0.1], TypeError),
    ("ckpt_layout", "ckpts", ValueError),
    ("ckpt_layout", 1, TypeError),
    ("ckpt_compile_cache", 3, TypeError),
    ("ckpt_compile_cache", "a\x00b", ValueError),
    # preemption
    ("ckpt_preempt_exit_code", 256, ValueError),
    ("ckpt_preempt_signals", "SIGFOO", ValueError),
    ("ckpt_preempt_signals", "SIGKILL", ValueError),
    ("ckpt_preempt_signals", 1.5, TypeError),
    ("ckpt_preempt_signals", True, TypeError),
    ("ckpt_preempt_signals", b"SIGTERM", TypeError),
    ("ckpt_deadline", "tomorrow", ValueError),
    ("ckpt_deadline", "+x", ValueError),
    ("ckpt_deadline", -5, ValueError),
    ("ckpt_deadline", True, TypeError),
    ("ckpt_deadline", b"auto", TypeError),
    ("ckpt_deadline_margin", -1, ValueError),
    ("ckpt_deadline_margin", "soon", ValueError),
    ("ckpt_deadline_margin", math.nan, ValueError),
    ("ckpt_deadline_margin", True, TypeError),
    ("ckpt_hang_timeout", 0, ValueError),
    ("ckpt_hang_timeout", "soon", ValueError),
    ("ckpt_hang_timeout", math.inf, ValueError),
    ("ckpt_hang_timeout", True, TypeError),
    ("ckpt_preempt_check", 0, ValueError),
    ("ckpt_preempt_check", "often", ValueError),
    ("ckpt_preempt_check", 1.5, ValueError),
]


@pytest.mark.parametrize(
    ("key", "value", "error"),
    INVALID_CASES,
    ids=[f"{key}-{type(value).__name__}-{i}" for i, (key, value, _) in enumerate(INVALID_CASES)],
)
def test_invalid_values_raise_naming_key(key: str, value: object, error: type[Exception]) -> None:
    """Each invalid type, range or choice raises the expected error naming the key."""
    with pytest.raises(error, match=key_pattern(key)):
        CkptConfig.from_params({key: value})


def test_every_key_has_an_invalid_case() -> None:
    """The invalid-value table covers every key in CKPT_KEYS."""
    assert {key for key, _, _ in INVALID_CASES} == set(CKPT_KEYS)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "auto"),
        ("AUTO", "auto"),
        ("on", "auto"),
        (True, "auto"),
        ("off", "off"),
        ("False", "off"),
        ("none", "auto"),  # as for every key: none means the default
        (False, "off"),
        (" /scratch/jax-cache ", "/scratch/jax-cache"),
    ],
)
def test_compile_cache_reads_auto_off_or_a_directory(value: object, expected: str) -> None:
    """ckpt_compile_cache is auto (also a true word or none), off (also a false word) or a directory."""
    assert CkptConfig.from_params({"ckpt_compile_cache": value}).compile_cache == expected


def test_bool_for_int_rejected() -> None:
    """A bool is not accepted as an integer, even though bool subclasses int."""
    with pytest.raises(TypeError, match=r"ckpt_save_interval must be an integer >= 0 \(.*\), not a boolean"):
        CkptConfig.from_params({"ckpt_save_interval": True})


def test_range_message_names_value_and_range() -> None:
    """A range violation names the key, the offending value and the allowed range."""
    with pytest.raises(ValueError, match=r"ckpt_skip_epochs must be an integer >= 0; got -3"):
        CkptConfig.from_params({"ckpt_skip_epochs": "-3"})


def test_choice_message_lists_choices() -> None:
    """An unknown choice lists the allowed values and echoes the input."""
    expected = r"ckpt_keep_mode must be one of 'linear', 'exponential', 'all'; got 'foo'"
    with pytest.raises(ValueError, match=expected):
        CkptConfig.from_params({"ckpt_keep_mode": "foo"})


def test_ckpt_async_auto_is_the_default_and_means_asynchronous() -> None:
    """ckpt_async is 'auto' unless given: asynchronous, in one process as in many; a given value stays."""
    for params in ({}, {"ckpt_async": "auto"}, {"ckpt_async": " AUTO "}, {"ckpt_async": None}):
        config = CkptConfig.from_params(params)
        assert config.async_save is None
        assert config.resolved().async_save is True
    assert CkptConfig.from_params({"ckpt_async": False}).resolved().async_save is False
    assert CkptConfig.from_params({"ckpt_async": "no"}).resolved().async_save is False
    assert CkptConfig.from_params({"ckpt_async": "yes"}).resolved().async_save is True
    with pytest.raises(ValueError, match=r"ckpt_async must be a boolean \(true/false.*\) or auto; got 'sometimes'"):
        CkptConfig.from_params({"ckpt_async": "sometimes"})
    parser = ckpt_parser(argparse.ArgumentParser())
    assert parser.parse_args(["--ckpt_async", "auto"]).ckpt_async is None
    assert parser.parse_args(["--ckpt_async"]).ckpt_async is True
    assert parser.parse_args(["--ckpt_async", "false"]).ckpt_async is False
    assert parser.parse_args([]).ckpt_async is None


def test_bool_message_lists_spellings() -> None:
    """An unrecognised boolean string lists the accepted spellings."""
    with pytest.raises(ValueError, match=r"ckpt_save_best must be a boolean \(true/false"):
        CkptConfig.from_params({"ckpt_save_best": "maybe"})


def test_unprintable_object_raises_type_error() -> None:
    """An object whose __str__ and __repr__ raise still gives a TypeError naming the key."""
    with pytest.raises(TypeError, match="ckpt_save_best_metric"):
        CkptConfig.from_params({"ckpt_save_best_metric": Unprintable()})


def test_hostile_fspath_raises_type_error() -> None:
    """A PathLike whose __fspath__ raises gives a TypeError naming the key."""
    with pytest.raises(TypeError, match="ckpt_directory"):
        CkptConfig.from_params({"ckpt_directory": BadPath()})


def test_hostile_index_raises_type_error() -> None:
    """An Integral whose __index__ raises gives a TypeError naming the key."""
    with pytest.raises(TypeError, match="ckpt_keep_limit: cannot interpret"):
        CkptConfig.from_params({"ckpt_keep_limit": HostileIntegral()})


def test_int_subclass_normalised_to_int() -> None:
    """An int subclass is stored as a plain int."""
    config = CkptConfig.from_params({"ckpt_keep_limit": WeirdInt(5)})
    assert config.keep_limit == 5
    assert type(config.keep_limit) is int


def test_deeply_nested_list_raises_type_error() -> None:
    """A list too deeply nested to repr still gives a TypeError naming the key."""
    nested: list[Any] = []
    for _ in range(100_000):
        nested = [nested]
    with pytest.raises(TypeError, match="ckpt_skip_epochs"):
        CkptConfig.from_params({"ckpt_skip_epochs": nested})


def test_huge_negative_int_message_is_short() -> None:
    """An integer too large for repr is summarised in the error message."""
    with pytest.raises(ValueError, match=r"ckpt_skip_epochs must be an integer >= 0; got <int with \d+ bits>"):
        CkptConfig.from_params({"ckpt_skip_epochs": -(10**5000)})


def test_long_value_is_truncated_in_message() -> None:
    """A long invalid string is truncated in the error message."""
    with pytest.raises(ValueError, match="ckpt_keep_mode") as info:
        CkptConfig.from_params({"ckpt_keep_mode": "x" * 10_000})
    assert len(str(info.value)) < 200


# --------------------------------------------------------------------------
# require_epochs
# --------------------------------------------------------------------------


@pytest.mark.parametrize("params", [{}, {"epochs": None}, {"epochs": "None"}])
def test_require_epochs_missing(params: dict[str, Any]) -> None:
    """require_epochs=True raises ValueError naming 'epochs' when it is unset."""
    with pytest.raises(ValueError, match="epochs"):
        CkptConfig.from_params(params, require_epochs=True)


def test_require_epochs_present() -> None:
    """require_epochs=True accepts a positive epochs value."""
    assert CkptConfig.from_params({"epochs": 10}, require_epochs=True).epochs == 10


def test_epochs_optional_by_default() -> None:
    """Without require_epochs, a missing epochs key gives None."""
    assert CkptConfig.from_params({}).epochs is None


# --------------------------------------------------------------------------
# Direct construction, replace, the round trip through gParameters
# --------------------------------------------------------------------------


def test_constructor_validates_and_normalises() -> None:
    """Direct construction coerces values just like from_params."""
    config = CkptConfig(keep_mode="EXPONENTIAL", skip_epochs="2")  # type: ignore[arg-type]
    assert config.keep_mode == "exponential"
    assert config.skip_epochs == 2


def test_constructor_rejects_none_for_required_field() -> None:
    """Direct construction rejects None for a field that is not optional."""
    with pytest.raises(TypeError, match="ckpt_save_best must not be None"):
        CkptConfig(save_best=None)  # type: ignore[arg-type]


def test_replace_returns_new_validated_config() -> None:
    """replace() changes fields on a copy and leaves the original untouched."""
    original = CkptConfig()
    changed = original.replace(keep_limit=5, on_error="WARN")
    assert changed.keep_limit == 5
    assert changed.on_error == "warn"
    assert original == CkptConfig()


def test_replace_revalidates() -> None:
    """replace() rejects invalid values with an error naming the gParameters key."""
    with pytest.raises(ValueError, match="ckpt_keep_limit"):
        CkptConfig().replace(keep_limit=0)


def test_replace_unknown_field() -> None:
    """replace() rejects unknown field names with TypeError."""
    with pytest.raises(TypeError, match="no_such_field"):
        CkptConfig().replace(no_such_field=1)


@pytest.mark.parametrize(
    "mode,epoch,expected",
    [("off", None, False), ("off", 3, True), ("auto", None, True), ("required", None, True), ("auto", 0, True)],
)
def test_restores_follows_restart_mode_unless_an_epoch_is_asked(mode: str, epoch: int | None, expected: bool) -> None:
    """restores() is False only for ckpt_restart_mode=off with no exact epoch asked for."""
    assert CkptConfig(restart_mode=mode).restores(epoch) is expected


def test_config_is_frozen() -> None:
    """Assigning to a field of a CkptConfig raises FrozenInstanceError."""
    config = CkptConfig()
    with pytest.raises(dataclasses.FrozenInstanceError, match="save_best"):
        config.save_best = False  # type: ignore[misc]


def as_params(config: CkptConfig) -> dict[str, object]:
    """The gParameters dict of ``config``: each key of the schema table with the field's value."""
    return {spec.key: getattr(config, spec.field) for spec in SPECS}


def test_params_round_trip() -> None:
    """from_params of a configuration's own values reproduces it (coercion is idempotent)."""
    config = CkptConfig(
        restart_mode="required",
        save_best=False,
        keep_mode="exponential",
        restart_epoch=4,
        metadata="m",
        epochs=9,
        async_timeout=1.5,
    )
    params = as_params(config)
    assert set(params) == set(CKPT_KEYS) - {"metadata"}
    assert CkptConfig.from_params(params) == config


# --------------------------------------------------------------------------
# str2bool
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true", True),
        ("YES", True),
        ("1", True),
        ("on", True),
        ("False", False),
        ("n", False),
        ("0", False),
        ("OFF", False),
        (True, True),
        (False, False),
    ],
)
def test_str2bool_accepts(text: str | bool, expected: bool) -> None:
    """str2bool converts the accepted spellings and passes bools through."""
    assert str2bool(text) is expected


@pytest.mark.parametrize("text", ["maybe", "", "2", "truthy"])
def test_str2bool_rejects(text: str) -> None:
    """str2bool raises argparse.ArgumentTypeError for unrecognised strings."""
    with pytest.raises(argparse.ArgumentTypeError, match="Boolean value expected"):
        str2bool(text)


# --------------------------------------------------------------------------
# ckpt_defs
# --------------------------------------------------------------------------


def test_ckpt_defs_shape() -> None:
    """ckpt_defs() gives one well-formed CANDLE definition per ckpt_* key."""
    defs = ckpt_defs()
    assert [d["name"] for d in defs] == CKPT_ONLY_KEYS
    for definition in defs:
        assert set(definition) <= {"name", "type", "default", "help", "choices"}
        assert {"name", "type", "default", "help"} <= set(definition)
        assert definition["help"].strip()
        assert "\n" not in definition["help"]
        assert "%" not in definition["help"]


def test_ckpt_defs_types_and_defaults() -> None:
    """Definitions use str2bool/int/float/str types and the documented defaults."""
    by_name = {d["name"]: d for d in ckpt_defs()}
    for key in BOOL_KEYS:
        assert by_name[key]["type"] is (str2bool_or_auto if key == "ckpt_async" else str2bool)
    for key in INT_KEYS[:-1]:
        assert by_name[key]["type"] is (str if key == "ckpt_save_steps" else int)  # auto, or an int
    assert by_name["ckpt_async_timeout"]["type"] is float
    assert by_name["ckpt_directory"]["type"] is str
    assert by_name["ckpt_keep_mode"] == {
        "name": "ckpt_keep_mode",
        "type": str,
        "default": "linear",
        "choices": ["linear", "exponential", "all"],
        "help": by_name["ckpt_keep_mode"]["help"],
    }
    for key, choices in CHOICE_KEYS.items():
        assert by_name[key]["choices"] == list(choices)
    assert by_name["ckpt_restart_epoch"]["default"] is None
    assert by_name["ckpt_metadata"]["default"] is None
    params = {name: d["default"] for name, d in by_name.items()}
    assert CkptConfig.from_params(params) == CkptConfig()


def test_ckpt_defs_excludes_epochs() -> None:
    """ckpt_defs() does not define CANDLE's own epochs parameter."""
    assert "epochs" not in {d["name"] for d in ckpt_defs()}


def test_ckpt_defs_appends_and_does_not_mutate() -> None:
    """ckpt_defs(defs) returns a new list and leaves defs and its dicts unchanged."""
    mine = {"name": "dense", "type": int, "nargs": "+", "help": "layers"}
    defs = [mine]
    snapshot = copy.deepcopy(defs)
    result = ckpt_defs(defs)
    assert result is not defs
    assert defs == snapshot
    assert result[0] is mine
    assert len(result) == 1 + len(CKPT_ONLY_KEYS)


def test_ckpt_defs_no_duplicates() -> None:
    """A name already defined in defs is kept and not defined a second time."""
    custom = {"name": "ckpt_keep_limit", "type": int, "default": 3, "help": "mine"}
    result = ckpt_defs([custom])
    names = [d["name"] for d in result]
    assert names.count("ckpt_keep_limit") == 1
    assert len(names) == len(set(names))
    assert result[0] is custom


def test_ckpt_defs_idempotent() -> None:
    """Applying ckpt_defs twice adds nothing the second time."""
    once = ckpt_defs()
    assert ckpt_defs(once) == once


def test_ckpt_defs_returns_fresh_dicts() -> None:
    """Mutating a returned definition does not affect later calls."""
    ckpt_defs()[0]["default"] = "mutated"
    assert ckpt_defs()[0]["default"] != "mutated"


# --------------------------------------------------------------------------
# ckpt_parser
# --------------------------------------------------------------------------


def test_ckpt_parser_defaults_round_trip() -> None:
    """Parsing no arguments and calling from_params gives the defaults."""
    parser = ckpt_parser(argparse.ArgumentParser())
    assert CkptConfig.from_params(vars(parser.parse_args([]))) == CkptConfig()


def test_ckpt_parser_returns_same_parser() -> None:
    """ckpt_parser returns the parser it was given."""
    parser = argparse.ArgumentParser()
    assert ckpt_parser(parser) is parser


def test_ckpt_parser_adds_one_option_per_definition() -> None:
    """Every ckpt_defs() name becomes a --<name> option."""
    parser = ckpt_parser(argparse.ArgumentParser())
    dests = {action.dest for action in parser._actions}
    assert set(CKPT_ONLY_KEYS) <= dests
    assert "epochs" not in dests


def test_ckpt_parser_flags_round_trip() -> None:
    """Command-line flags are parsed and converted by from_params."""
    parser = ckpt_parser(argparse.ArgumentParser())
    args = parser.parse_args(
        [
            "--ckpt_restart_mode",
            "REQUIRED",
            "--ckpt_save_best",
            "false",
            "--ckpt_checksum",
            "--ckpt_skip_epochs",
            "2",
            "--ckpt_keep_mode",
            "exponential",
            "--ckpt_keep_limit",
            "7",
            "--ckpt_directory",
            "/tmp/ck",
            "--ckpt_metadata",
            "job",
            "--ckpt_restart_epoch",
            "5",
            "--ckpt_on_error",
            "warn",
            "--ckpt_async",
            "yes",
            "--ckpt_async_timeout",
            "12.5",
            "--ckpt_upload_url",
            "s3://bucket/job",
            "--ckpt_upload_mode",
            "END",
            "--ckpt_upload_options",
            '{"anon": false}',
        ]
    )
    config = CkptConfig.from_params(vars(args))
    assert config == CkptConfig().replace(
        restart_mode="required",
        save_best=False,
        checksum=True,
        skip_epochs=2,
        keep_mode="exponential",
        keep_limit=7,
        directory="/tmp/ck",
        metadata="job",
        restart_epoch=5,
        on_error="warn",
        async_save=True,
        async_timeout=12.5,
        upload_url="s3://bucket/job",
        upload_mode="end",
        upload_options='{"anon": false}',
    )


def test_ckpt_parser_bare_bool_flag_means_true() -> None:
    """A bool flag without a value means True."""
    parser = ckpt_parser(argparse.ArgumentParser())
    assert parser.parse_args(["--ckpt_async"]).ckpt_async is True


def test_ckpt_parser_restart_epoch_none() -> None:
    """--ckpt_restart_epoch none parses to None."""
    parser = ckpt_parser(argparse.ArgumentParser())
    assert parser.parse_args(["--ckpt_restart_epoch", "none"]).ckpt_restart_epoch is None


@pytest.mark.parametrize(
    "argv",
    [
        ["--ckpt_keep_mode", "bogus"],
        ["--ckpt_save_best", "maybe"],
        ["--ckpt_skip_epochs", "x"],
        ["--ckpt_restart_epoch", "x"],
        ["--ckpt_async_timeout", "soon"],
        ["--ckpt_upload_mode", "sometimes"],
    ],
)
def test_ckpt_parser_rejects_bad_values(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Invalid command-line values make argparse exit with an error naming the option."""
    parser = ckpt_parser(argparse.ArgumentParser())
    with pytest.raises(SystemExit, match="2"):
        parser.parse_args(argv)
    assert argv[0] in capsys.readouterr().err


def test_ckpt_parser_skips_existing_options() -> None:
    """Options the parser already has are kept as they are, not re-added."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt_keep_limit", type=int, default=3)
    parser.add_argument("--best", dest="ckpt_save_best", default="no")
    ckpt_parser(parser)
    ckpt_parser(parser)
    args = parser.parse_args([])
    assert args.ckpt_keep_limit == 3
    assert args.ckpt_save_best == "no"
    assert CkptConfig.from_params(vars(args)).save_best is False


def test_ckpt_parser_help_renders() -> None:
    """--help text renders and mentions every option."""
    help_text = ckpt_parser(argparse.ArgumentParser()).format_help()
    for key in CKPT_ONLY_KEYS:
        assert f"--{key}" in help_text


# --------------------------------------------------------------------------
# Property tests
# --------------------------------------------------------------------------


def _from_params_or_error(
    params: dict[str, object],
) -> tuple[CkptConfig | None, ValueError | TypeError | None]:
    """Return (config, None) on success or (None, error) for ValueError/TypeError."""
    try:
        return CkptConfig.from_params(params), None
    except (ValueError, TypeError) as exc:
        return None, exc


ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(),
    st.binary(),
    st.lists(st.integers()),
    st.dictionaries(st.text(), st.integers()),
)


@pytest.mark.parametrize("key", CKPT_KEYS)
@settings(max_examples=200, deadline=None)
@given(value=ANY_VALUE)
def test_any_value_gives_config_or_keyed_error(key: str, value: object) -> None:
    """Any value for any key gives a CkptConfig or a ValueError/TypeError naming the key."""
    config, error = _from_params_or_error({key: value})
    if error is None:
        assert isinstance(config, CkptConfig)
    else:
        assert key in str(error)


@settings(max_examples=200, deadline=None)
@given(params=st.dictionaries(st.sampled_from(CKPT_KEYS), ANY_VALUE))
def test_any_params_dict_gives_config_or_error(params: dict[str, object]) -> None:
    """Any mix of keys and values gives a CkptConfig or a ValueError/TypeError naming a key."""
    config, error = _from_params_or_error(params)
    if error is None:
        assert config is not None
        assert CkptConfig.from_params(as_params(config)) == config
    else:
        assert any(key in str(error) for key in params)


# --------------------------------------------------------------------------
# Remote upload parameters
# --------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["s3://bucket/job", "memory://job", "file:///scratch/job", "gs://b/p", "  s3://b/p  "])
def test_upload_url_accepts_fsspec_urls(url: str) -> None:
    """Any protocol://path URL is accepted, surrounding whitespace removed."""
    assert CkptConfig.from_params({"ckpt_upload_url": url}).upload_url == url.strip()


def test_upload_url_none_spellings_disable_uploads() -> None:
    """'none' and '' (as a config file or the CLI give them) mean no uploads."""
    assert CkptConfig.from_params({"ckpt_upload_url": "none"}).upload_url is None
    assert CkptConfig.from_params({"ckpt_upload_url": ""}).upload_url is None


def test_upload_url_error_shows_accepted_form() -> None:
    """A bare path is refused with a message showing the accepted URL form."""
    with pytest.raises(ValueError, match=r"ckpt_upload_url must be a URL of the form protocol://path"):
        CkptConfig.from_params({"ckpt_upload_url": "bucket/job"})


def test_upload_options_string_and_mapping_give_same_canonical_text() -> None:
    """Options given as JSON text or as a dict are stored as the same canonical JSON."""
    a = CkptConfig.from_params({"ckpt_upload_options": '{"b": 1, "a": {"x": "y"}}'})
    b = CkptConfig.from_params({"ckpt_upload_options": {"a": {"x": "y"}, "b": 1}})
    assert a.upload_options == b.upload_options == '{"a": {"x": "y"}, "b": 1}'
    assert hash(a) == hash(b)


def test_upload_options_not_an_object_is_refused() -> None:
    """A JSON list is valid JSON but not storage options: the message says an object is needed."""
    with pytest.raises(ValueError, match=r"ckpt_upload_options must be a JSON object"):
        CkptConfig.from_params({"ckpt_upload_options": "[1]"})


@pytest.mark.parametrize(
    ("key", "text", "sentence"),
    [
        ("ckpt_keep_limit", "many", "ckpt_keep_limit must be an integer > 0; got 'many'"),
        ("ckpt_keep_limit", "0", "ckpt_keep_limit must be an integer > 0; got 0"),
        ("ckpt_save_steps", "-1", "ckpt_save_steps must be auto or an integer >= 0 (0 disables); got -1"),
    ],
)
def test_a_bad_integer_reads_the_same_from_the_dict_and_the_flag(key, text, sentence, capsys):
    """Issue 40 item 4: a gParameters value and the --ckpt_* flag are refused in one sentence naming what is allowed
    (the dict said 'must be an integer', the flag 'must be integer > 0')."""
    with pytest.raises(ValueError) as raised:
        CkptConfig.from_params({key: text})
    assert str(raised.value) == sentence
    parser = ckpt_parser(argparse.ArgumentParser(prog="job"))
    with pytest.raises(SystemExit):
        parser.parse_args([f"--{key}", text])
    assert capsys.readouterr().err.splitlines()[-1] == f"job: error: argument --{key}: {sentence}"


def test_preempt_check_is_deprecated_with_one_warning() -> None:
    """ckpt_preempt_check still parses (old configs stay valid) but says once, through the log that opens next
    (as the unknown-key warning), that it no longer does anything."""
    from candle_ckpt.config.params import _warn_deprecated, take_unreported

    _warn_deprecated.cache_clear()
    take_unreported()
    CkptConfig.from_params({"ckpt_preempt_check": 4})
    CkptConfig.from_params({"ckpt_preempt_check": 4})
    CkptConfig.from_params({"ckpt_preempt_check": 1})  # the default, as a parser's defaults dict carries it
    _warn_deprecated.cache_clear()
    CkptConfig.from_params({"ckpt_preempt_check": 1})
    assert [line for line in take_unreported() if "ckpt_preempt_check" in line] == [
        "ckpt_preempt_check is deprecated and has no effect: no process talks on a training step any more "
        "(docs/preemption.rst)"
    ]  # the 4 only: a default value says nothing
    CkptConfig.from_params({"ckpt_preempt_check": 4})
    said = [line for line in take_unreported() if "ckpt_preempt_check" in line]
    assert said == ["ckpt_preempt_check is deprecated and has no effect: no process talks on a training step any "
                    "more (docs/preemption.rst)"]  # fmt: skip


@pytest.mark.parametrize("word", ["none", "None", ""])
def test_hang_timeout_none_survives_a_round_trip_through_a_params_dict(word: str) -> None:
    """ckpt_hang_timeout=none stays off when the config goes back into a params dict (None there means auto)."""
    config = CkptConfig.from_params({"ckpt_hang_timeout": word})
    assert config.hang_timeout == "none"
    assert CkptConfig.from_params(as_params(config)).hang_timeout == "none"
