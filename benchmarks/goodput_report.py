"""The goodput benchmark's printed table, reStructuredText table and plot.

Imported by ``bench_goodput.py`` (run that one); no Keras.
"""

from __future__ import annotations

from typing import Any

import goodput_lib as G

PARTS = ("startup", "restore", "compile", "lost_work", "other")


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def cells(c: str, r: dict[str, Any]) -> list[str]:
    """One contender's row: name, goodput, interruptions, lost per interruption (total and parts), overhead,
    exact."""
    over = f"{100 * r['overhead']:+.1f}%" if r.get("overhead") is not None else "-"
    if r.get("floor"):
        return [r["name"], "-", "-", "-", *["-"] * len(PARTS), over, "-"]
    if not r.get("completed"):
        return [r["name"], "0", "-", r.get("why", "did not complete"), *["-"] * len(PARTS), over, "-"]
    per = r["per_interruption"]
    exact = "yes" if r["exact"] else "no"
    return [
        r["name"],
        f"{r['goodput']:.2f}",
        str(r["interruptions"]),
        _s(per["total"]),
        *(_s(per[k]) for k in PARTS),
        over,
        exact,
    ]


HEAD = ["contender", "goodput", "interr.", "lost/interr. s", "start-up", "restore", "compile", "lost work"]
HEAD += ["other", "overhead", "exact"]


def line(c: str, r: dict[str, Any]) -> str:
    """A one-line summary of a contender (printed as each finishes)."""
    return " | ".join(f"{h}: {v}" for h, v in zip(HEAD, cells(c, r), strict=True))


def table(result: dict[str, Any]) -> str:
    """The printed table with the run's set-up, the start-up floor and the load average."""
    m = result["machine"]
    load = result["loadavg_1min_at_launches"]
    floor = result["floor_parts"]
    lines = [
        f"schedule {result['schedule']} (seed {result['seed']}, intervals x{result.get('interval_x', 1.0)}): "
        f"{result['epochs']} epochs of "
        f"{result['steps_per_epoch']} steps; uninterrupted, no checkpointing: {result['uninterrupted_s']:.1f} s",
        f"machine: {m.get('cpu', '?')}, {m['cpus']} CPUs; keras {m['keras']}, jax {m['jax']}, orbax-checkpoint "
        f"{m['orbax-checkpoint']}; 1-min load average at launches {load['min']:.1f} to {load['max']:.1f} "
        f"(median {load['median']:.1f}, {load['launches']} launches)",
        f"start-up floor (no checkpointing, launch to first finished step): {result['startup_floor_s']:.2f} s "
        f"(start-up {floor['startup']:.2f}, fit set-up {floor['restore']:.2f}, compile {floor['compile']:.2f})",
        "lost seconds per interruption: total, then start-up / restore / compile / lost work / other",
        "",
        _table(HEAD, [cells(c, r) for c, r in result["contenders"].items()]),
    ]
    return "\n".join(lines)


def rst(result: dict[str, Any]) -> str:
    """The table as reStructuredText (for docs/performance.rst)."""
    return _table(HEAD, [cells(c, r) for c, r in result["contenders"].items()])


def _table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    rule = "  ".join("=" * w for w in widths)
    fmt = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([rule, fmt(head), rule, *(fmt(r) for r in rows), rule, ""])


def plot(results: list[dict[str, Any]], path: str) -> None:
    """A PNG of goodput against the mean time between failures: per contender the model
    ``(1 - overhead) * MTBF / (MTBF + L)`` from each run's measured ``L`` and overhead, and the measured points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    mtbfs = [5 * 1.05**k for k in range(int(1 + (3.3 / 0.0212)))]  # 5 s to ~10,000 s
    colours = {
        "backup": "tab:orange",
        "orbax": "tab:green",
        "candle": "tab:blue",
        "candle-mtbf": "tab:purple",
        "none": "tab:gray",
    }
    styles = ["-", "--", ":"]
    for i, result in enumerate(results):
        for c, r in result["contenders"].items():
            if c == "none" or not r.get("completed") or not r.get("interruptions"):
                continue  # without a save a failure loses all the work so far: no constant L
            lost, over = r["per_interruption"]["total"], max(0.0, r["overhead"])
            label = f"{r['name']}, schedule {result['schedule']} (L = {lost:.1f} s, overhead {100 * over:.1f}%)"
            ys = [G.modelled_goodput(m, lost, over) for m in mtbfs]
            ax.plot(mtbfs, ys, styles[i % 3], color=colours.get(c), label=label)
            ax.plot([r["wall_s"] / r["interruptions"]], [r["goodput"]], "o", color=colours.get(c))
    ax.set_xscale("log")
    ax.set_ylim(0, 1)
    ax.set_xlabel("mean time between failures, s (dots: measured runs, at wall time / interruptions)")
    ax.set_ylabel("goodput (uninterrupted time / wall time)")
    ax.set_title("Goodput against the mean time between failures (model: (1 - overhead) MTBF / (MTBF + L))")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
