"""The schema of every ``ckpt_*`` parameter: the single source of defaults, choices and help.

One table (one :class:`~candle_ckpt.config.spec.Spec` per key), kept as two by idea: the checkpoint's own keys
(:mod:`~candle_ckpt.config.checkpoint_keys`) and those of a job on a preemptible cluster
(:mod:`~candle_ckpt.config.cluster_keys`). Read by the coercion in :mod:`candle_ckpt.config.coerce`, by
:class:`~candle_ckpt.config.params.CkptConfig` and by the argparse / CANDLE definitions in
:mod:`candle_ckpt.config.cli_args`.
"""

from __future__ import annotations

from candle_ckpt.config.checkpoint_keys import CHECKPOINT_SPECS, EPOCHS_SPEC
from candle_ckpt.config.cluster_keys import CLUSTER_SPECS
from candle_ckpt.config.spec import Spec

SPECS: tuple[Spec, ...] = (*CHECKPOINT_SPECS, *CLUSTER_SPECS, EPOCHS_SPEC)

SPEC_BY_KEY: dict[str, Spec] = {spec.key: spec for spec in SPECS}
METADATA_FALLBACK_KEY = "metadata"

#: Every gParameters key read by :meth:`CkptConfig.from_params`: all
#: ``ckpt_*`` keys, then CANDLE's ``epochs`` and ``metadata``.
CKPT_KEYS: tuple[str, ...] = (
    *(spec.key for spec in SPECS),
    METADATA_FALLBACK_KEY,
)
