"""The ``ckpt-info.json`` sidecar: schema, serialisation and validation.

A sidecar is written last into ``work/`` before the commit rename, so a
committed directory always has one. It carries CANDLE's keys (``epoch``,
``save_best_metric``, ``best_metric_last``, ``model_file``, ``checksum``,
``timestamp``, ``time_elapsed``, ``metadata``) plus the size and CRC32 of every
file, and a CRC of its own canonical JSON so a flipped bit in the sidecar is
caught too.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from candle_ckpt.core.checksum import crc32, format_crc
from candle_ckpt.core.errors import SidecarError
from candle_ckpt.core.layout import is_safe_filename

SCHEMA_VERSION = 1
MAX_SIDECAR_BYTES = 1 << 20  # a sidecar is a few KiB; refuse anything absurd


@dataclass(frozen=True)
class FileEntry:
    """Size and CRC32 (8 hex digits, or None when checksums are off) of one file."""

    size: int
    crc32: str | None


@dataclass(frozen=True)
class Sidecar:
    """The contents of one ``ckpt-info.json``."""

    epoch: int
    generation: int
    model_file: str
    files: dict[str, FileEntry]
    save_best_metric: str | None = None
    best_metric_last: float | None = None
    best_epoch: int | None = None
    save_best_mode: str | None = None
    timestamp: str = ""
    time_elapsed: float = 0.0
    metadata: str | None = None
    logs: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    resumed_from: int | None = None
    keras_version: str | None = None
    backend: str | None = None
    save_duration_s: float = 0.0
    save_mb_per_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    # A step checkpoint (ckpts/steps/GGG): the training steps done in epoch ``epoch + 1``; None: an epoch's.
    step: int | None = None
    # The lineage this checkpoint belongs to (docs/campaigns.rst): a random id given when a training starts
    # from nothing or rolls back, inherited by every checkpoint that continues it; None in older sidecars.
    lineage: str | None = None
    schema_version: int = SCHEMA_VERSION

    @property
    def checksum(self) -> str | None:
        """CANDLE's ``checksum`` key: the CRC32 of the model file."""
        entry = self.files.get(self.model_file)
        return entry.crc32 if entry else None

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.files.values())

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready dict (what ``restart()`` returns)."""
        d = asdict(self)
        d["checksum"] = self.checksum
        return d

    def to_json(self) -> bytes:
        body = self.to_dict()
        body["sidecar_crc32"] = format_crc(crc32(_canonical(body)))
        return (json.dumps(body, indent=2, sort_keys=True, default=_jsonable) + "\n").encode()

    @classmethod
    def from_json(cls, raw: bytes, *, source: str = "ckpt-info.json") -> Sidecar:
        """Parse and validate; raise :class:`SidecarError` naming ``source``."""
        if len(raw) > MAX_SIDECAR_BYTES:
            raise SidecarError(f"{source}: {len(raw)} bytes, larger than the {MAX_SIDECAR_BYTES} allowed")
        try:
            body = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise SidecarError(f"{source}: not valid JSON ({err})") from None
        if not isinstance(body, dict):
            raise SidecarError(f"{source}: expected a JSON object, got {type(body).__name__}")
        stored = body.pop("sidecar_crc32", None)
        if stored is not None and stored != format_crc(crc32(_canonical(body))):
            raise SidecarError(f"{source}: its own CRC does not match (the file was altered or damaged)")
        return cls._from_body(body, source)

    @classmethod
    def _from_body(cls, body: dict[str, Any], source: str) -> Sidecar:
        version = body.get("schema_version")
        if version != SCHEMA_VERSION:
            raise SidecarError(f"{source}: schema_version {version!r} is not supported (expected {SCHEMA_VERSION})")
        _need(body, "epoch", int, source, minimum=0)
        _need(body, "generation", int, source, minimum=0)
        _need(body, "model_file", str, source)
        files = body.get("files")
        if not isinstance(files, dict) or not files:
            raise SidecarError(f"{source}: 'files' must be a non-empty object")
        entries = {}
        for name, entry in files.items():
            if not is_safe_filename(name):
                raise SidecarError(f"{source}: file name {name!r} is not a plain file name; refusing it")
            if not isinstance(entry, dict):
                raise SidecarError(f"{source}: files[{name!r}] must be an object")
            _need(entry, "size", int, source, minimum=0, where=f"files[{name!r}].")
            crc = entry.get("crc32")
            if crc is not None and (not isinstance(crc, str) or len(crc) != 8):
                raise SidecarError(f"{source}: files[{name!r}].crc32 must be 8 hex digits or null")
            entries[name] = FileEntry(entry["size"], crc)
        if body["model_file"] not in entries:
            raise SidecarError(
                f"{source}: model_file {body['model_file']!r} is not one of the checkpoint's files {sorted(entries)}"
            )
        if body.get("step") is not None:
            _need(body, "step", int, source, minimum=0)
        if body.get("lineage") is not None:
            _need(body, "lineage", str, source)
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in body.items() if k in known}
        kwargs["files"] = entries
        for key in ("logs", "extra"):
            if not isinstance(kwargs.get(key, {}), dict):
                raise SidecarError(f"{source}: {key!r} must be an object")
        return cls(**kwargs)


def _need(body: dict, key: str, typ: type, source: str, *, minimum: int | None = None, where: str = "") -> None:
    value = body.get(key)
    if not isinstance(value, typ) or isinstance(value, bool):
        raise SidecarError(f"{source}: {where}{key} must be {typ.__name__}; got {value!r}")
    if minimum is not None and value < minimum:
        raise SidecarError(f"{source}: {where}{key} must be >= {minimum}; got {value!r}")


def _jsonable(value: Any) -> Any:
    """Turn numpy scalars and the like into JSON types."""
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def clean_logs(logs: dict[str, Any] | None) -> dict[str, Any]:
    """Return fit logs as plain JSON numbers (NaN/inf become strings)."""
    out: dict[str, Any] = {}
    for key, value in (logs or {}).items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            out[str(key)] = str(value)
            continue
        out[str(key)] = number if math.isfinite(number) else str(number)
    return out


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), default=_jsonable).encode()
