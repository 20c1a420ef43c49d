"""The ``ckpt_*`` keys of a job on a preemptible cluster: how it writes (in the background, to a persistent tier,
between epochs) and how it survives (preemption signals, deadlines, hangs, crash loops, the compile cache a
restart reads back); one :class:`~candle_ckpt.config.spec.Spec` per key.

What a checkpoint holds and which one resumes: :mod:`~candle_ckpt.config.checkpoint_keys`.
"""

from __future__ import annotations

from candle_ckpt.config.spec import Spec

CLUSTER_SPECS: tuple[Spec, ...] = (
    Spec(
        key="ckpt_max_no_progress_restarts",
        field="max_no_progress_restarts",
        kind="int",
        default=3,
        help=(
            "restart() refuses (exit status 65) when the same checkpoint would be resumed this many times in a "
            "row, each earlier start failing (an error or a hang) before it committed (a crash loop); 0 never "
            "refuses."
        ),
        allowed="integer >= 0",
        minimum=0,
    ),
    Spec(
        key="ckpt_on_error",
        field="on_error",
        kind="choice",
        default="raise",
        help=(
            "What to do when writing a checkpoint fails: 'raise' stops training, 'warn' logs a warning and continues."
        ),
        allowed="raise, warn",
        choices=("raise", "warn"),
    ),
    Spec(
        key="ckpt_async",
        field="async_save",
        kind="bool",
        default=None,
        help=(
            "Write checkpoints in a background thread so that training is not blocked by disk I/O "
            "(auto, the default: on, except for a save whose host copy would not fit in memory)."
        ),
        allowed="boolean, or auto",
        optional=True,
    ),
    Spec(
        key="ckpt_async_timeout",
        field="async_timeout",
        kind="float",
        default=600.0,
        help=("Seconds that train end and interpreter exit wait for pending background checkpoint writes."),
        allowed="finite number > 0 (seconds)",
        minimum=0.0,
        strict=True,
    ),
    Spec(
        key="ckpt_upload_url",
        field="upload_url",
        kind="url",
        default=None,
        help=(
            "Deprecated name of ckpt_persistent_url (used when that one is unset): fsspec URL (s3://, gs://, "
            "file://, memory://...) to which committed checkpoints are copied in the background."
        ),
        allowed="URL of the form protocol://path, or None",
        optional=True,
    ),
    Spec(
        key="ckpt_upload_mode",
        field="upload_mode",
        kind="choice",
        default="every",
        help=(
            "Deprecated name of ckpt_drain (used when that one is unset): 'every' uploads each committed "
            "checkpoint; 'end' uploads only best and last when training ends."
        ),
        allowed="every, end",
        choices=("every", "end"),
    ),
    Spec(
        key="ckpt_upload_options",
        field="upload_options",
        kind="json",
        default=None,
        help=(
            "JSON object of fsspec storage options for ckpt_upload_url, e.g. "
            '\'{"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}\'.'
        ),
        allowed="JSON object (string or mapping), or None",
        optional=True,
    ),
    Spec(
        key="ckpt_persistent_url",
        field="persistent_url",
        kind="location",
        default=None,
        help=(
            "The persistent tier (docs/campaigns.rst): a shared file-system path or an fsspec URL that a background "
            "drain fills from ckpt_directory (the fast tier); restart() resumes from the newer of the two. "
            "None: ckpt_upload_url, else no persistent tier."
        ),
        allowed="path, URL of the form protocol://path, or None",
        optional=True,
    ),
    Spec(
        key="ckpt_drain",
        field="drain",
        kind="choice",
        default=None,
        help=(
            "Which commits the drain copies to the persistent tier: every one; every ckpt_drain_interval-th "
            "(interval); only preemption saves (preempt); only best and last at the end (end). Except with end, "
            "a preemption save and the last save are always drained before the process exits. "
            "None: ckpt_upload_mode's choice (every)."
        ),
        allowed="every, interval, preempt, end, or None",
        optional=True,
        choices=("every", "interval", "preempt", "end"),
    ),
    Spec(
        key="ckpt_drain_interval",
        field="drain_interval",
        kind="int",
        default=5,
        help="With ckpt_drain=interval: drain every N-th epoch commit.",
        allowed="integer > 0",
        minimum=0,
        strict=True,
    ),
    Spec(
        key="ckpt_drain_timeout",
        field="drain_timeout",
        kind="float",
        default=25.0,
        help=(
            "Seconds a preemption save's drain may take before the process exits (less if ckpt_deadline is "
            "closer); Slurm's default grace between SIGTERM and SIGKILL is 30 s. Not finished in time: exit "
            "status 75. At any other exit with the run still open (an error in fit), the newest commit's drain."
        ),
        allowed="finite number > 0 (seconds)",
        minimum=0.0,
        strict=True,
    ),
    Spec(
        key="ckpt_compile_cache",
        field="compile_cache",
        kind="cache",
        default="auto",
        help=(
            "JAX's persistent compilation cache, so that a restart loads the compiled steps instead of compiling "
            "them again (docs/performance.rst). auto: on the JAX backend, in <ckpts>/compile-cache beside the "
            "checkpoints, unless the job set its own jax_compilation_cache_dir; off; or a directory."
        ),
        allowed="auto, off, or a directory",
    ),
    Spec(
        key="ckpt_save_steps",
        field="save_steps",
        kind="steps",
        default="auto",
        help=(
            "Also checkpoint every N training steps of an epoch (into ckpts/steps/); 0 disables step checkpoints; "
            "auto: an interval chosen from the measured step and save times and the failure rate (at most 2 "
            "percent overhead, no more often than Young/Daly; docs/preemption.rst)."
        ),
        allowed="auto or an integer >= 0 (0 disables)",
        minimum=0,
    ),
    Spec(
        key="ckpt_mtbf",
        field="mtbf",
        kind="mtbf",
        default="auto",
        help=(
            "Mean seconds between failures for ckpt_save_steps=auto; auto: learned from the run's restart "
            "history (restarts.jsonl), 4 hours before its first failure."
        ),
        allowed="auto or seconds > 0",
        minimum=0.0,
        strict=True,
    ),
    Spec(
        key="ckpt_preempt_signals",
        field="preempt_signals",
        kind="signals",
        default="SIGTERM",
        help=(
            "Signals that make fit save a checkpoint at the next step and stop (a scheduler's preemption or "
            "wall-time warning): a comma list such as SIGTERM,SIGUSR1 (names or numbers); none disables."
        ),
        allowed="signal names or numbers, comma-separated, or none",
        none_is_value=True,
    ),
    Spec(
        key="ckpt_preempt_exit_code",
        field="preempt_exit_code",
        kind="exit",
        default="signal",
        help=(
            "After a preemption save: signal ends the process with 128 + the signal's number (143 for SIGTERM, "
            "what the signal itself gives; a deadline counts as SIGTERM); an integer exits with that status; "
            "return stops training and lets fit return."
        ),
        allowed="signal, return, or integer 0-255",
    ),
    Spec(
        key="ckpt_deadline",
        field="deadline",
        kind="deadline",
        default="auto",
        help=(
            "Wall-time end: save and stop when the time left is below the measured save time plus "
            "ckpt_deadline_margin. auto: the Slurm job's end time; none; +SECONDS from the start; epoch "
            "seconds; or an ISO 8601 time."
        ),
        allowed="auto, none, +SECONDS, epoch seconds, ISO time",
        none_is_value=True,
    ),
    Spec(
        key="ckpt_deadline_margin",
        field="deadline_margin",
        kind="float",
        default=60.0,
        help="Seconds kept in reserve before ckpt_deadline, beyond the measured time of a step and a save.",
        allowed="number >= 0 (seconds)",
        minimum=0.0,
    ),
    Spec(
        key="ckpt_hang_timeout",
        field="hang_timeout",
        kind="timeout",
        default="auto",
        help=(
            "End a run that makes no progress (no step, save or meeting finished; or restart()'s restore, or the "
            "directory's opening, with no byte read or written) for this "
            "long: every thread's stack to ckpt.log, then exit 124 to be requeued. auto: from the measured step, "
            "save and start-up times (docs/preemption.rst); seconds; or none."
        ),
        allowed="auto, none, or seconds > 0",
        none_is_value=True,
    ),
    Spec(
        key="ckpt_preempt_check",
        field="preempt_check",
        kind="int",
        default=1,
        help=(
            "Deprecated, no effect (a warning says so): the processes of a multi-process job no longer talk on "
            "a step; a request reaches all of them through the coordination service (docs/preemption.rst)."
        ),
        allowed="integer > 0",
        minimum=0,
        strict=True,
    ),
)
