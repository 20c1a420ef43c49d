"""``ckpt-info.json`` files written by ECP-CANDLE itself, read so that its checkpoints can be adopted.

CANDLE (Benchmarks ``common/ckpt_keras_utils.py``, candle_lib ``candle/ckpt_utils.py``)
writes ``epochs/NNN/model.h5`` and beside it a JSON object with the keys
``epoch``, ``save_best_metric``, ``best_metric_last``, ``model_file``,
``checksum``, ``timestamp``, ``time_elapsed`` and ``metadata``. It has no
``schema_version``, no ``files`` table and no sizes; ``checksum`` is the
CRC32 of the model file as a *decimal* string, or ``"__DISABLED__"``;
``best_metric_last`` may be ``Infinity``; ``time_elapsed`` is the time since
the previous save (or ``"__FIRST__"``), not a running total.

:func:`from_candle` turns such an object into a :class:`CandleSidecar`: a
:class:`~candle_ckpt.core.sidecar.Sidecar` whose one file is the model file
(its size taken from the disk, its CRC converted to our hex form) and whose
``to_dict()`` is CANDLE's object unchanged, which is what CANDLE's
``restart()`` returned.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from candle_ckpt.core.checksum import format_crc
from candle_ckpt.core.errors import SidecarError
from candle_ckpt.core.layout import is_safe_filename
from candle_ckpt.core.sidecar import FileEntry, Sidecar

DISABLED = "__DISABLED__"
CANDLE_SCHEMA = 0  # our schema_version for a sidecar CANDLE wrote (it has none)


@dataclass(frozen=True)
class CandleSidecar(Sidecar):
    """A sidecar written by CANDLE; ``candle`` is its JSON object as read."""

    candle: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """CANDLE's own keys and values, as CANDLE's ``restart()`` returned them."""
        return dict(self.candle)


def is_candle_body(body: object) -> bool:
    """True for a JSON object that looks like CANDLE's sidecar (no ``schema_version``)."""
    return isinstance(body, dict) and "schema_version" not in body and "model_file" in body and "epoch" in body


def candle_crc(value: object, source: str) -> str | None:
    """CANDLE's ``checksum`` (decimal CRC32 string or ``"__DISABLED__"``) as 8 hex digits, or None.

    Raises:
        SidecarError: it is neither.
    """
    if value is None or value == DISABLED:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SidecarError(f"{source}: checksum must be a decimal CRC32 or {DISABLED!r}; got {value!r}")
    text = str(value).strip()
    if not text.isdigit() or int(text) >= 1 << 32:
        raise SidecarError(f"{source}: checksum must be a decimal CRC32 or {DISABLED!r}; got {value!r}")
    return format_crc(int(text))


def _best_value(body: dict[str, Any], source: str) -> float | None:
    value = body.get("best_metric_last", body.get("best_stat_last"))
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise SidecarError(f"{source}: best_metric_last must be a number; got {value!r}")
    return float(value)


def from_candle(raw: bytes, *, source: str, model_size: int | None, best_epoch: int | None = None) -> CandleSidecar:
    """Parse a CANDLE ``ckpt-info.json``.

    Args:
        raw: The file's bytes.
        source: Its path, for messages.
        model_size: Size of the model file on disk (CANDLE records none), or
            None if the file is missing (the checkpoint then fails verification).
        best_epoch: The epoch CANDLE's ``best`` link points to, if any: the
            epoch of ``best_metric_last``.

    Raises:
        SidecarError: the object is not a usable CANDLE sidecar (the message says why).
    """
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SidecarError(f"{source}: not valid JSON ({err})") from None
    if not is_candle_body(body):
        raise SidecarError(f"{source}: not a CANDLE ckpt-info.json (it needs 'epoch' and 'model_file')")
    epoch, model_file = body["epoch"], body["model_file"]
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise SidecarError(f"{source}: epoch must be an int >= 0; got {epoch!r}")
    if not isinstance(model_file, str) or not is_safe_filename(model_file):
        raise SidecarError(f"{source}: model_file {model_file!r} is not a plain file name; refusing it")
    crc = candle_crc(body.get("checksum"), source)
    best = _best_value(body, source)
    metric = body.get("save_best_metric", body.get("save_best_stat"))
    return CandleSidecar(
        epoch=epoch,
        generation=0,  # older than anything we commit (ours start at 1)
        model_file=model_file,
        files={model_file: FileEntry(model_size if model_size is not None else -1, crc)},
        save_best_metric=metric if isinstance(metric, str) else None,
        best_metric_last=best,
        best_epoch=best_epoch if best is not None and math.isfinite(best) else None,
        timestamp=str(body.get("timestamp", "")),
        # CANDLE's time_elapsed is the time since its previous save, not a running
        # total: our cumulative clock starts again at 0 from an adopted checkpoint.
        time_elapsed=0.0,
        metadata=body.get("metadata") if isinstance(body.get("metadata"), str) else None,
        reason="candle",
        schema_version=CANDLE_SCHEMA,
        candle=body,
    )
