"""Draw the metric history kept in checkpoint sidecars (``candle-ckpt plot``).

Each sidecar holds the Keras epoch logs of its epoch, so the history covers the
checkpoints still on disk. matplotlib is imported only when drawing, and only
through its ``Figure`` and Agg canvas: no pyplot, no GUI backend, no display.
"""

from __future__ import annotations

from collections.abc import Mapping

from candle_ckpt.core.errors import MissingDependency
from candle_ckpt.core.log import counted
from candle_ckpt.core.sidecar import Sidecar

INSTALL_HINT = "python3 -m pip install matplotlib (from a checkout: python3 -m pip install -e '.[plot]')"


def require_matplotlib() -> None:
    """Raise :class:`MissingDependency` (one line, with the pip command) if matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingDependency(
            f"'plot' needs matplotlib, which is not installed; install it with: {INSTALL_HINT}"
        ) from None


def metric_series(sides: Mapping[int, Sidecar]) -> dict[str, dict[int, float]]:
    """Return ``{metric: {epoch: value}}`` for every numeric value in the sidecars' logs.

    Non-finite values are stored as strings by the engine ("nan", "inf") and
    are left out here.
    """
    series: dict[str, dict[int, float]] = {}
    for epoch, side in sorted(sides.items()):
        for key, value in side.logs.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                series.setdefault(key, {})[epoch] = float(value)
    return series


def plot_history(
    sides: Mapping[int, Sidecar],
    *,
    best: int | None,
    last: int | None,
    title: str,
    path: str,
    dpi: int = 100,
) -> int:
    """Write an image of the metric history of ``sides`` to ``path``.

    One panel per metric (``loss`` with ``val_loss``, ...), the monitored metric
    first; a marker per checkpoint, the ``best`` checkpoint starred, the
    monitored metric's best-so-far (``best_metric_last``) dotted and ``last``
    as a dashed line.

    Args:
        sides: Sidecars by epoch.
        best: Epoch of the ``best`` link, or None.
        last: Epoch of the ``last`` link, or None.
        title: Figure title (the checkpoint directory).
        path: Output file; matplotlib picks the format from its extension.
        dpi: Resolution.

    Returns:
        The number of metrics drawn.

    Raises:
        ValueError: no sidecar has a numeric metric, or the format is unknown.
    """
    series = metric_series(sides)
    if not series:
        raise ValueError("nothing to plot: no checkpoint has numeric metrics in its sidecar")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    monitored = sides[max(sides)].save_best_metric
    groups = _panels(series, monitored)
    fig = Figure(figsize=(8, 2.8 * len(groups)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(groups), 1, squeeze=False, sharex=True)[:, 0]
    for ax, (group, names) in zip(axes, groups.items(), strict=True):
        for name in names:
            points = sorted(series[name].items())
            ax.plot([e for e, _ in points], [v for _, v in points], marker="o", label=name)
        if monitored in names:
            _draw_best(ax, sides, series[monitored], monitored, best)
        if last is not None and last in sides:
            ax.axvline(last, linestyle="--", color="tab:red", linewidth=1, label=f"last (epoch {last})")
        ax.set_ylabel(group)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    axes[-1].set_xlabel("epoch (completed epochs); markers = checkpoints on disk")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(f"{title}: {counted(len(sides), 'retained checkpoint')}", fontsize="medium")
    fig.savefig(path, dpi=dpi)
    return len(series)


def _panels(series: Mapping[str, object], monitored: str | None) -> dict[str, list[str]]:
    """Metric names by panel (``loss`` with ``val_loss``), the monitored metric's panel first."""
    groups: dict[str, list[str]] = {}
    for name in sorted(series):
        groups.setdefault(name.removeprefix("val_"), []).append(name)
    order = sorted(groups, key=lambda g: (monitored is None or g != monitored.removeprefix("val_"), g))
    return {group: groups[group] for group in order}


def _draw_best(ax, sides: Mapping[int, Sidecar], values: Mapping[int, float], monitored: str, best: int | None) -> None:
    """On the monitored metric's panel: its best-so-far as a dotted step, and the ``best`` checkpoint starred."""
    steps = sorted((e, s.best_metric_last) for e, s in sides.items() if s.best_metric_last is not None)
    if steps:
        ax.step(
            [e for e, _ in steps],
            [v for _, v in steps],
            where="post",
            linestyle=":",
            color="gray",
            label=f"best {monitored} so far",
        )
    if best is not None and best in values:
        ax.plot(
            [best],
            [values[best]],
            marker="*",
            markersize=16,
            color="gold",
            markeredgecolor="black",
            linestyle="none",
            label=f"best (epoch {best})",
        )
