"""The checkpoint's own ``ckpt_*`` keys: what a checkpoint holds, when one is saved, which are kept, where they
live and which one a restart resumes (one :class:`~candle_ckpt.config.spec.Spec` per key).

The keys of running on a preemptible cluster (background writes, tiers, step checkpoints, preemption, deadlines,
hangs, crash loops) are :mod:`~candle_ckpt.config.cluster_keys`; :mod:`~candle_ckpt.config.schema` joins both.
"""

from __future__ import annotations

from candle_ckpt.config.spec import Spec

#: The keep rules' names (``ckpt_keep_mode``, ``candle-ckpt prune --keep-mode``); core.retention maps each to its rule.
KEEP_MODES: tuple[str, ...] = ("linear", "exponential", "all")

CHECKPOINT_SPECS: tuple[Spec, ...] = (
    Spec(
        key="ckpt_restart_mode",
        field="restart_mode",
        kind="choice",
        default="auto",
        help=(
            "Restart behaviour: 'off' never restarts, 'auto' resumes from the "
            "latest valid checkpoint if there is one, 'required' fails if "
            "none can be loaded."
        ),
        allowed="off, auto, required",
        choices=("off", "auto", "required"),
    ),
    Spec(
        key="ckpt_save_best",
        field="save_best",
        kind="bool",
        default=True,
        help="Also keep the best model so far, judged by ckpt_save_best_metric.",
        allowed="boolean",
    ),
    Spec(
        key="ckpt_save_best_metric",
        field="save_best_metric",
        kind="str",
        default="val_loss",
        help=("Metric from the Keras epoch logs used to judge the best model, e.g. val_loss."),
        allowed="non-empty string",
    ),
    Spec(
        key="ckpt_save_best_mode",
        field="save_best_mode",
        kind="choice",
        default="auto",
        help=("Whether a lower ('min') or higher ('max') metric is better; 'auto' infers it from the metric name."),
        allowed="auto, min, max",
        choices=("auto", "min", "max"),
    ),
    Spec(
        key="ckpt_skip_epochs",
        field="skip_epochs",
        kind="int",
        default=0,
        help="Number of initial epochs during which no checkpoint is written.",
        allowed="integer >= 0",
        minimum=0,
    ),
    Spec(
        key="ckpt_save_interval",
        field="save_interval",
        kind="int",
        default=1,
        help="Write a checkpoint every N epochs; 0 disables checkpoint saving.",
        allowed="integer >= 0 (0 disables saving)",
        minimum=0,
    ),
    Spec(
        key="ckpt_checksum",
        field="checksum",
        kind="bool",
        default=True,
        help=("Record a checksum of each checkpoint and verify it before restarting from it."),
        allowed="boolean",
    ),
    Spec(
        key="ckpt_keep_mode",
        field="keep_mode",
        kind="choice",
        default="linear",
        help=(
            "Retention policy for old checkpoints: 'linear' keeps the newest "
            "ckpt_keep_limit, 'exponential' keeps an exponentially thinned "
            "history, 'all' keeps every checkpoint."
        ),
        allowed=", ".join(KEEP_MODES),
        choices=KEEP_MODES,
    ),
    Spec(
        key="ckpt_keep_limit",
        field="keep_limit",
        kind="int",
        default=1_000_000,
        help=("Maximum number of epoch checkpoints kept on disk; older ones are deleted."),
        allowed="integer > 0",
        minimum=0,
        strict=True,
    ),
    Spec(
        key="ckpt_directory",
        field="directory",
        kind="path",
        default="./save",
        help="Directory in which checkpoints are written.",
        allowed="non-empty path",
    ),
    Spec(
        key="ckpt_metadata",
        field="metadata",
        kind="text",
        default=None,
        help=("Free-form string stored with each checkpoint; falls back to CANDLE's metadata parameter."),
        allowed="string or None",
        optional=True,
    ),
    Spec(
        key="ckpt_save_weights_only",
        field="save_weights_only",
        kind="bool",
        default=False,
        help=(
            "True: write model.weights.h5 (weights and optimizer state, what restart() loads). "
            "False: write the state once, as model.keras (the full model, loadable with "
            "keras.models.load_model), which restart() reads in place."
        ),
        allowed="boolean",
    ),
    Spec(
        key="ckpt_restart_epoch",
        field="restart_epoch",
        kind="int",
        default=None,
        help=("Restart from the checkpoint of this epoch instead of the latest one; None means the latest."),
        allowed="integer >= 0 or None",
        optional=True,
        minimum=0,
    ),
    Spec(
        key="ckpt_best_metric_last",
        field="best_metric_last",
        kind="metric",
        default=None,
        help=(
            "Best value of ckpt_save_best_metric so far, which an epoch must beat to be the new best "
            "(CANDLE scripts set it from restart()'s best_metric_last); None: taken from the checkpoint "
            "restart() loaded, else no best yet."
        ),
        allowed="number (inf allowed) or None",
        optional=True,
    ),
    Spec(
        key="ckpt_layout",
        field="layout",
        kind="choice",
        default=None,
        help=(
            "'nested': <ckpt_directory>/ckpts/epochs/NNN (Benchmarks master, CandleCheckpointCallback); "
            "'flat': <ckpt_directory>/epochs/NNN (candle_lib develop); None: the API chooses "
            "(CandleCkptKeras flat, the others nested)."
        ),
        allowed="nested, flat, or None",
        optional=True,
        choices=("nested", "flat"),
    ),
)

#: CANDLE's standard ``epochs`` key (no ``ckpt_`` prefix, no CLI definition): the last row of the schema.
EPOCHS_SPEC = Spec(
    key="epochs",
    field="epochs",
    kind="int",
    default=None,
    help="Total number of training epochs (CANDLE's standard epochs key).",
    allowed="integer > 0 or None",
    optional=True,
    minimum=0,
    strict=True,
    cli=False,
)
