"""One row of the parameter schema (:class:`Spec`), and the words a raw value is read with.

The rows themselves are two tables, one per idea: :mod:`~candle_ckpt.config.checkpoint_keys` (what a checkpoint
holds, when one is saved, which are kept and which one a restart resumes) and
:mod:`~candle_ckpt.config.cluster_keys` (how a job on a preemptible cluster writes and survives);
:mod:`~candle_ckpt.config.schema` joins them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TRUE_STRINGS = frozenset({"true", "1", "yes", "on", "t", "y"})
FALSE_STRINGS = frozenset({"false", "0", "no", "off", "f", "n"})
BOOL_ALLOWED = "true/false, yes/no, on/off, t/f, y/n or 1/0"
NONE_STRINGS = frozenset({"none", ""})
MAX_REPR = 80


@dataclass(frozen=True)
class Spec:
    """Description of one gParameters key.

    Attributes:
        key: The gParameters key.
        field: The matching :class:`CkptConfig` attribute.
        kind: One of ``bool``, ``int``, ``float``, ``choice``, ``str``,
            ``path``, ``text`` (free-form string), ``url`` (``protocol://...``),
            ``json`` (a JSON object, kept as canonical text), ``steps`` (``auto`` or
            an ``int``) or ``mtbf`` (``auto`` or a ``float``).
        default: Default value used when the key is missing or None.
        help: One-line description for ``--help`` and the README.
        allowed: Human-readable description of the accepted values.
        optional: Whether None is a legal value.
        choices: Legal values for ``choice`` parameters.
        minimum: Lower bound for numeric parameters, if any.
        strict: Whether ``minimum`` itself is excluded.
        cli: Whether the key gets a CLI/benchmark definition.
        maximum: Upper bound (included) for numeric parameters, if any.
        none_is_value: The word ``"none"`` is a value of its own (it turns
            the feature off) rather than "use the default".
    """

    key: str
    field: str
    kind: str
    default: Any
    help: str
    allowed: str
    optional: bool = False
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    strict: bool = False
    cli: bool = True
    maximum: float | None = None
    none_is_value: bool = False
