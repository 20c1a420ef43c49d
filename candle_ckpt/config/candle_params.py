"""CANDLE's parameter helpers (``ParamType``, ``ModelType``, ``ParamRequired``, ``param()``) and
the candle_lib develop generation's defaults.

The names and enum members are those of candle_lib's ``candle/ckpt_utils.py``
and Benchmarks' ``common/ckpt_keras_utils.py``, so a script that uses them
keeps working after the import swap. Errors name the key and what is allowed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from enum import Enum, auto, unique
from typing import Any

from candle_ckpt.config.cli_args import str2bool


class ModelType(Enum):
    """The framework of a checkpointed model (candle_lib); candle_ckpt serves ``KERAS``."""

    KERAS = auto()
    PYTORCH = auto()


@unique
class ParamType(Enum):
    """The types :func:`param` converts to (CANDLE's enum, same members)."""

    STRING = auto()
    BOOLEAN = auto()
    INTEGER = auto()
    INTEGER_NN = auto()  # integer >= 0
    INTEGER_GZ = auto()  # integer > 0
    FLOAT = auto()
    FLOAT_NN = auto()  # float >= 0


class ParamRequired:
    """Pass as ``param()``'s default: the key must be present."""


def param(
    gParameters: Mapping[str, Any],
    key: str,
    dflt: Any,
    type_: ParamType = ParamType.STRING,
    allowed: Iterable[Any] | None = None,
) -> Any:
    """Read ``key`` from ``gParameters`` with CANDLE's conversions and checks.

    A missing key (or None, or the string ``"None"``) gives ``dflt``; a
    :class:`ParamRequired` default makes the key mandatory.

    Raises:
        ValueError: the key is required and missing, or the value is not in ``allowed``.
        TypeError: ``gParameters`` is not a mapping, or the value does not convert to ``type_``.
    """
    if not isinstance(gParameters, Mapping):
        raise TypeError(f"param(): gParameters must be the parameter dict; got {type(gParameters).__name__}")
    value = gParameters.get(key)
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        if isinstance(dflt, ParamRequired):
            raise ValueError(f"parameter {key!r} is required but missing from gParameters")
        value = dflt
    value = _convert(key, value, type_)
    if allowed is not None and value not in list(allowed):
        raise ValueError(f"parameter {key!r} is {value!r}; allowed values: {list(allowed)}")
    return value


def _convert(key: str, value: Any, type_: ParamType) -> Any:
    if value is None:
        return None
    if type_ is ParamType.STRING:
        return str(value)
    if type_ is ParamType.BOOLEAN:
        try:
            return str2bool(value)
        except Exception:
            raise TypeError(f"parameter {key!r} is {value!r} but must be a boolean") from None
    if type_ in (ParamType.INTEGER, ParamType.INTEGER_NN, ParamType.INTEGER_GZ):
        return _bounded(key, value, int, type_, 1 if type_ is ParamType.INTEGER_GZ else 0)
    if type_ in (ParamType.FLOAT, ParamType.FLOAT_NN):
        return _bounded(key, value, float, type_, 0)
    raise TypeError(f"param(): type_ must be a ParamType; got {type_!r}")


def _bounded(key: str, value: Any, kind: type, type_: ParamType, low: int) -> Any:
    if isinstance(value, bool):
        raise TypeError(f"parameter {key!r} is {value!r} but must be {type_.name}")
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise TypeError(f"parameter {key!r} is {value!r} but must be {type_.name}") from None
    if kind is float and math.isnan(number):
        raise TypeError(f"parameter {key!r} is NaN but must be {type_.name}")
    if type_.name.endswith(("_NN", "_GZ")) and number < low:
        raise TypeError(f"parameter {key!r} is {value!r} but must be {type_.name} (>= {low})")
    return number


def develop_params(gParameters: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters with candle_lib develop's checkpoint defaults made explicit.

    * ``ckpt_directory`` None (its default in ``finalize_parameters``) means
      ``<output_dir>/ckpts``; a relative one is under ``output_dir`` (as
      candle_lib joins them); ``output_dir`` missing means the current directory.
    * ``ckpt_layout`` defaults to ``flat``: ``epochs/``, ``best``, ``last`` and
      ``work/`` sit in that directory, with no extra ``ckpts/`` level.
    """
    out = dict(gParameters)
    output_dir = out.get("output_dir")
    if output_dir is None or (isinstance(output_dir, str) and output_dir.strip().lower() in ("", "none")):
        output_dir = "."
    if not isinstance(output_dir, (str, os.PathLike)):
        raise TypeError(f"output_dir must be a path (str); got {type(output_dir).__name__}")
    directory = out.get("ckpt_directory")
    if directory is None or (isinstance(directory, str) and directory.strip().lower() == "none"):
        out["ckpt_directory"] = os.path.join(os.fspath(output_dir), "ckpts")
    elif isinstance(directory, (str, os.PathLike)) and not os.path.isabs(os.fspath(directory)):
        out["ckpt_directory"] = os.path.join(os.fspath(output_dir), os.fspath(directory))
    layout = out.get("ckpt_layout")
    if layout is None or (isinstance(layout, str) and layout.strip().lower() == "none"):
        out["ckpt_layout"] = "flat"
    return out
