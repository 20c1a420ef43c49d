"""``candle-ckpt campaign --plot FILE / --html FILE``: the campaign's figures, and one self-contained page.

The figures are drawn from what the table is read from (the newest sidecars and the restart histories):
each run's progress over wall time (a point at each restart, at the epoch it resumed, and one at its
newest commit; a move is a cross) and each run's best value of the monitored metric. matplotlib is
imported only here, through its ``Figure`` and Agg canvas (no pyplot, no display), as ``plot`` does. The
page embeds the figures as base64 PNG: one file to copy anywhere and open in a browser.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from candle_ckpt.cli import campaign_state as S
from candle_ckpt.cli.common import CliError
from candle_ckpt.cli.plotting import INSTALL_HINT
from candle_ckpt.core.log import counted

COLORS = {
    "done": "tab:green",
    "training": "tab:blue",
    "moved": "tab:purple",
    "preempted": "tab:orange",
    "failed": "tab:red",
    "stale": "tab:gray",
    "refused": "black",
}
LABELLED = 40  # up to this many runs, each is named in the figures


def require_matplotlib_for(args: argparse.Namespace) -> None:
    """One line naming the pip command when ``--plot`` or ``--html`` is asked for without matplotlib."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        what = "--plot" if args.plot else "--html"
        raise CliError(
            f"campaign {what} needs matplotlib, which is not installed; install it with: {INSTALL_HINT}"
        ) from None
    for option in ("plot", "html"):
        path = getattr(args, option)
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise CliError(f"--{option} {path}: directory {os.path.dirname(os.path.abspath(path))} does not exist")


def progress_points(facts: S.RunFacts) -> list[tuple[float, float, bool]]:
    """``(time, epochs done, moved here)`` of one run: each restart (at the epoch it resumed) and its newest commit."""
    points: list[tuple[float, float, bool]] = []
    host = None
    for record in facts.history:
        if record.get("event") != "restart":
            continue
        epoch = record.get("epoch")
        done = float(epoch) if isinstance(epoch, (int, float)) else 0.0
        if isinstance(record.get("step"), int) and record.get("step"):
            done += 0.5  # somewhere in the epoch after it: the steps per epoch are not in the history
        points.append((float(record["time"]), done, host is not None and record.get("host") != host))
        host = record.get("host")
    n = facts.newest
    if n is not None and n.time is not None:
        if not points and n.time_elapsed > 0:
            points.append((n.time - n.time_elapsed, 0.0, False))  # its start, had it never stopped
        points.append((n.time, n.epoch + (0.5 if n.step is not None else 0.0), False))
    return sorted(points)


def draw(runs: Sequence[S.RunFacts], rows: Sequence[Mapping[str, Any]], info: Mapping[str, Any]):
    """The campaign's figure: progress over wall time (top) and the best metric of each run (bottom)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    by_run = {r["run"]: r for r in rows}
    fig = Figure(figsize=(10, 8), layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1)
    times = [p[0] for f in runs for p in progress_points(f)]
    start = min(times, default=time.time())
    span, unit = (3600.0, "hours") if times and max(times) - start > 7200 else (60.0, "minutes")
    for facts in runs:
        points = progress_points(facts)
        if not points:
            continue
        color = COLORS[by_run[facts.run]["state"]]
        hours = [(t - start) / span for t, _, _ in points]
        label = facts.run if len(runs) <= LABELLED else None
        top.plot(hours, [e for _, e, _ in points], marker=".", color=color, alpha=0.8, label=label)
        moved = [(h, e) for h, (_, e, m) in zip(hours, points, strict=True) if m]
        if moved:
            top.plot([h for h, _ in moved], [e for _, e in moved], "x", color="red", markersize=9)
    top.set_xlabel(f"{unit} since the campaign's first start (x: a restart on another host)")
    top.set_ylabel("epochs done")
    top.grid(True, alpha=0.3)
    if 0 < len(runs) <= LABELLED:
        top.legend(fontsize="small", ncol=2)
    _draw_best(bottom, rows, info)
    states = ", ".join(f"{n} {s}" for s, n in info["states"].items() if n)
    fig.suptitle(f"{counted(info['runs'], 'run')}: {states or 'nothing yet'}", fontsize="medium")
    return fig


def _draw_best(ax, rows: Sequence[Mapping[str, Any]], info: Mapping[str, Any]) -> None:
    best = info["best"]
    if best is None:
        ax.text(0.5, 0.5, "no run records a monitored metric yet", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    scored = S.sort_rows([dict(r) for r in rows if r["metric"] == best["metric"] and r["best"] is not None], "best")
    xs = range(len(scored))
    ax.bar(xs, [r["best"] for r in scored], color=[COLORS[r["state"]] for r in scored])
    if len(scored) <= LABELLED:
        ax.set_xticks(list(xs), [r["run"] for r in scored], rotation=60, ha="right", fontsize="small")
    else:
        ax.set_xlabel("runs, best first")
    ax.set_ylabel(f"best {best['metric']}")
    ax.set_title(f"best: {best['run']}, {best['metric']} {best['best']:.6g} at epoch {best['best_epoch']}")
    ax.grid(True, axis="y", alpha=0.3)


def write_plot(runs, rows, info, path: str, dpi: int) -> str:
    """Draw the figure into ``path`` (the format follows the extension); return the absolute path."""
    out = os.path.abspath(path)
    try:
        draw(runs, rows, info).savefig(out, dpi=dpi)
    except ValueError as err:  # an unknown extension
        raise CliError(f"--plot {path}: {err}") from None
    return out


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
th, td {{ padding: 0.25em 0.7em; border-bottom: 1px solid #ddd; text-align: left; white-space: nowrap; }}
th {{ background: #f4f4f4; position: sticky; top: 0; }}
td.state {{ font-weight: bold; }}
{colors}
img {{ max-width: 100%; }}
</style></head><body>
<h1>{title}</h1>
<p>{summary}</p>
<p><small>Read at {when} from the newest sidecars and restart histories of {roots}.</small></p>
{figure}
<table id="runs">
<thead><tr>{header}</tr></thead>
<tbody>
{body}
</tbody></table>
</body></html>
"""


def page(shown: Sequence[Mapping[str, Any]], info: Mapping[str, Any], roots: Sequence[str], png: bytes | None) -> str:
    """The self-contained page: the summary, the figure (a base64 PNG), the table with each state's reason."""
    header, cells = S.table_cells([dict(r) for r in shown])
    head = "".join(f"<th>{html.escape(h)}</th>" for h in [*header, "WHY"])
    lines = []
    for r, line in zip(shown, cells, strict=True):
        tds = [f"<td>{html.escape(c)}</td>" for c in line]
        tds[1] = f'<td class="state {r["state"]}">{html.escape(line[1])}</td>'
        tds.append(f"<td>{html.escape(str(r['why']))}</td>")
        lines.append(f'<tr class="{r["state"]}">{"".join(tds)}</tr>')
    figure = ""
    if png is not None:
        data = base64.b64encode(png).decode()
        figure = f'<img alt="progress and best metric per run" src="data:image/png;base64,{data}">'
    colors = "\n".join(f"td.{s} {{ color: {c.removeprefix('tab:')}; }}" for s, c in COLORS.items())
    return PAGE.format(
        title=html.escape(f"Campaign: {', '.join(roots)}"),
        summary=html.escape(S.summary_line(info)),
        when=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        roots=html.escape(", ".join(roots)),
        figure=figure,
        colors=colors,
        header=head,
        body="\n".join(lines),
    )


def write_html(runs, rows, shown, info, path: str, dpi: int, roots: Sequence[str]) -> str:
    """Write the page into ``path``; return the absolute path."""
    buffer = io.BytesIO()
    draw(runs, rows, info).savefig(buffer, format="png", dpi=dpi)
    out = os.path.abspath(path)
    with open(out, "w", encoding="utf-8") as f:
        f.write(page(shown, info, roots, buffer.getvalue()))
    return out
