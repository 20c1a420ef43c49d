"""Targets (PASS/FAIL computed from the measurements), the printed table and the plot.

Imported by ``bench_checkpoint.py`` (run that one).
"""

from __future__ import annotations

import math
from typing import Any

ASYNC = "candle_ckpt async (defaults)"
SYNC = "candle_ckpt sync (defaults)"
ORBAX = "OrbaxCheckpoint (defaults)"
MC_KERAS = "ModelCheckpoint (.keras, default)"
TARGET_MIB = 768  # the targets are stated for this size


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def targets(size: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets for one size's results: name, ratio, limit, and pass (None: not measured)."""
    lim, c, rs, mem = size["limits"], size["contenders"], size["restart"], size.get("memory") or {}

    def stall(name: str) -> float | None:
        row = c.get(name)
        return row["stall_s"] if row and "stall_s" in row else None

    probe = mem.get(ASYNC)
    memcpy = lim["snapshot_memcpy_in_fit_s"]
    checks = [
        ("default async stall / host snapshot (memcpy at epoch end)", stall(ASYNC), memcpy, 1.5),
        ("default async stall / OrbaxCheckpoint stall", stall(ASYNC), stall(ORBAX), 0.5),
        ("default sync stall (CRC, every fsync) / ModelCheckpoint(.keras) stall", stall(SYNC), stall(MC_KERAS), 1.0),
        ("restart (CRC verify) / keras load_weights", rs["candle_restart_s"], rs["keras_load_weights_s"], 1.1),
        (
            "default async peak extra host memory / state size",
            probe["peak_extra_bytes"] if probe else None,
            probe["state_bytes"] if probe else None,
            1.1,
        ),
    ]
    out = []
    for name, a, b, limit in checks:
        ratio = _ratio(a, b)
        out.append({"name": name, "ratio": ratio, "limit": limit, "pass": None if ratio is None else ratio <= limit})
    return out


def _ms(s: float | None) -> str:
    return f"{s * 1000:10.1f}" if s is not None and not math.isnan(s) else f"{'-':>10}"


def report(result: dict[str, Any]) -> str:
    """The printed table: stall per contender and size, the limits, restart, memory, targets."""
    sizes = result["sizes"]
    keys = list(sizes)
    m = result["machine"]
    lines = [
        f"machine: {m.get('cpu', '?')}, {m['cpus']} CPUs, {m.get('mem_gib', '?')} GiB, keras {m['keras']} "
        f"({m['backend']}), orbax-checkpoint {m.get('orbax_checkpoint')}, load average at start {m['loadavg']}"
        f", at end {result.get('loadavg_end')}",
        f"command: {result['command']}",
        "",
        "median stall per epoch end (ms), by state size:",
        f"{'contender':44}" + "".join(f"{sizes[k]['state_mib']:9.0f} MiB" for k in keys),
    ]
    names = list(dict.fromkeys(n for k in keys for n in sizes[k]["contenders"]))
    for name in names:
        cells = []
        for k in keys:
            row = sizes[k]["contenders"].get(name, {})
            cells.append(_ms(row.get("stall_s")) if "stall_s" in row else f"{row.get('skipped', '-')[:10]:>10}")
        lines.append(f"{name:44}" + "   ".join(cells))
    rows = [
        ("host snapshot (memcpy at epoch end)", lambda s: s["limits"]["snapshot_memcpy_in_fit_s"]),
        ("raw h5py write + fsync (at epoch end)", lambda s: s["limits"]["raw_h5py_write_fsync_in_fit_s"]),
        ("candle_ckpt restart (defaults, CRC)", lambda s: s["restart"]["candle_restart_s"]),
        ("candle_ckpt restart (weights only, CRC)", lambda s: s["restart"]["candle_restart_weights_only_s"]),
        ("keras load_weights (.weights.h5)", lambda s: s["restart"]["keras_load_weights_s"]),
    ]
    lines += ["", f"{'limits and restart (ms)':44}"]
    for label, get in rows:
        lines.append(f"{label:44}" + "   ".join(_ms(get(sizes[k])) for k in keys))
    for k in keys:
        mem = sizes[k].get("memory")
        if mem:
            lines += ["", f"peak extra host memory at {sizes[k]['state_mib']:.0f} MiB (RSS):"]
            for name, v in mem.items():
                x = v["peak_extra_bytes"] / v["state_bytes"]
                lines.append(f"  {name:42} {v['peak_extra_bytes'] / 2**20:9.1f} MiB  {x:5.2f}x state")
    for k in keys:
        ret = sizes[k].get("retained")
        if ret:
            lines += ["", f"retained checkpoints at {sizes[k]['state_mib']:.0f} MiB: save ms, restart ms, open ms"]
            for count, v in ret.items():
                lines.append(f"  {count:>6} {_ms(v['save_stall_s'])} {_ms(v['restart_s'])} {_ms(v['open_s'])}")
    for k in keys:
        lines += ["", f"targets at {sizes[k]['state_mib']:.0f} MiB:"]
        for t in sizes[k]["targets"]:
            verdict = {True: "PASS", False: "FAIL", None: "n/a "}[t["pass"]]
            ratio = f"{t['ratio']:6.2f}x" if t["ratio"] is not None else "   n/a "
            lines.append(f"  {verdict}  {t['name']:70} {ratio}  (<= {t['limit']}x)")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> None:
    """A PNG of median stall against state size, one line per contender (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = result["sizes"]
    keys = sorted(sizes, key=lambda k: sizes[k]["state_mib"])
    series: dict[str, list[tuple[float, float]]] = {}
    for k in keys:
        s = sizes[k]
        for name, row in s["contenders"].items():
            if "stall_s" in row:
                series.setdefault(name, []).append((s["state_mib"], row["stall_s"]))
        lim = s["limits"]
        series.setdefault("host snapshot (memcpy)", []).append((s["state_mib"], lim["snapshot_memcpy_in_fit_s"]))
        series.setdefault("raw h5py write + fsync", []).append(
            (s["state_mib"], s["limits"]["raw_h5py_write_fsync_in_fit_s"])
        )
    fig, ax = plt.subplots(figsize=(9, 6))
    for name, points in series.items():
        xs, ys = zip(*points, strict=True)
        style = "--" if name.startswith(("host", "raw")) else "-"
        width = 2.5 if name.startswith("candle_ckpt") and "defaults" in name else 1.2
        ax.plot(xs, ys, style, marker="o", linewidth=width, label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = [sizes[k]["state_mib"] for k in keys]
    ax.set_xticks(ticks, [f"{t:.0f}" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("model state (weights + Adam moments), MiB")
    ax.set_ylabel("median stall per epoch end, s")
    m = result["machine"]
    ax.set_title(f"Checkpoint stall against state size ({m.get('cpus')} CPUs, keras {m['keras']})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rst(result: dict[str, Any]) -> str:
    """The stall, restart, memory and target tables as reStructuredText (for docs/performance.rst)."""
    sizes = result["sizes"]
    keys = sorted(sizes, key=lambda k: sizes[k]["state_mib"])
    head = ["contender"] + [f"{sizes[k]['state_mib']:.0f} MiB" for k in keys]
    names = list(dict.fromkeys(n for k in keys for n in sizes[k]["contenders"]))
    body = []
    for name in names:
        cells = []
        for k in keys:
            row = sizes[k]["contenders"].get(name, {})
            cells.append(f"{row['stall_s']:.3f} s" if "stall_s" in row else row.get("skipped", "-"))
        body.append([name, *cells])
    limits = [
        ("host snapshot (memcpy at epoch end)", "limits", "snapshot_memcpy_in_fit_s"),
        ("raw h5py write + fsync (at epoch end)", "limits", "raw_h5py_write_fsync_in_fit_s"),
        ("restart(), defaults (CRC verify + load)", "restart", "candle_restart_s"),
        ("restart(), weights only (CRC verify + load)", "restart", "candle_restart_weights_only_s"),
        ("Keras ``load_weights`` (.weights.h5)", "restart", "keras_load_weights_s"),
    ]
    body += [[label, *(f"{sizes[k][part][key]:.3f} s" for k in keys)] for label, part, key in limits]
    out = [_rst_table(head, body)]
    for k in keys:
        mem = sizes[k].get("memory")
        if mem:
            rows = [
                [n, f"{v['peak_extra_bytes'] / 2**20:.0f} MiB", f"{v['peak_extra_bytes'] / v['state_bytes']:.2f}x"]
                for n, v in mem.items()
            ]
            out += [
                f"Peak extra host memory at {sizes[k]['state_mib']:.0f} MiB:",
                "",
                _rst_table(["", "RSS", "x state"], rows),
            ]
    for k in keys:
        rows = [
            [
                t["name"],
                "n/a" if t["ratio"] is None else f"{t['ratio']:.2f}x",
                f"<= {t['limit']}x",
                {True: "PASS", False: "FAIL", None: "n/a"}[t["pass"]],
            ]
            for t in sizes[k]["targets"]
        ]
        out += [
            f"Targets at {sizes[k]['state_mib']:.0f} MiB:",
            "",
            _rst_table(["target", "measured", "limit", ""], rows),
        ]
    return "\n".join(out)


def _rst_table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    rule = "  ".join("=" * w for w in widths)
    fmt = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([rule, fmt(head), rule, *(fmt(r) for r in rows), rule, ""])
