"""``candle-ckpt campaign ROOT...``: every run of a campaign in one table, read from its newest sidecars.

A ROOT is a campaign's persistent directory (one sub-directory per run: docs/campaigns.rst's
``ckpt_persistent_url=<campaign>/<run id>``; a local path or an fsspec URL), one run's directory, or a
glob of ``ckpt_directory`` paths (fast tiers, nested or flat layout). What is read of each run: the
names in ``epochs/`` and ``steps/``, the newest epoch checkpoint's sidecar (and a newer step
checkpoint's), the restart history (``restarts.jsonl``, :mod:`candle_ckpt.core.history`) and, on a fast
tier, the last 64 KiB of ``ckpt.log``; never an archive nor a model file. On an object store a run
costs one listing (a recursive ``find``) and two or three small reads. A directory without its sidecar
yet (a checkpoint being written or drained) is passed over, and a cut history line skipped: a campaign
is read while it runs. The copies of one run (its persistent directory and fast tiers, or fast tiers
on several nodes) are one row: a run is known by its directory's name, the recipe's run id.

The state rules are :mod:`candle_ckpt.cli.campaign_state`'s; the figures and the page
:mod:`candle_ckpt.cli.campaign_report`'s.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from candle_ckpt.cli import campaign_state as S
from candle_ckpt.cli.common import EXIT_OK, CliError
from candle_ckpt.core import history as H
from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CheckpointError, CorruptCheckpoint
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.storage.reader import CheckpointReader
from candle_ckpt.storage.remote import EPOCHS, STEPS, PersistentTier, sort_key
from candle_ckpt.storage.steps import StepCheckpoints

EXPECTED = (
    "expected a campaign's persistent directory (one sub-directory per run), a run's directory, or a glob of "
    "ckpt_directory paths"
)
RUN_MARKS = (EPOCHS, STEPS, H.HISTORY_FILE)
LOG_TAIL = 64 * 1024
LINEAGE_REFUSAL = "refusing to overwrite it"  # the drain's LineageConflict, as ckpt.log records it
RESTART_LINE = " restart: "  # each life of a run starts with restart() lines in ckpt.log


class Source(NamedTuple):
    """One directory of one run: where, on which file system (None: local), which tier, which layout."""

    run: str
    path: str
    fs: Any = None
    tier: str = "persistent"
    flat: bool = True
    options: str | None = None  # fsspec storage options (JSON), for a URL


# -- finding the runs ----------------------------------------------------------------------------


def _local_kind(path: str) -> tuple[str, bool] | None:
    """``(tier, flat)`` of a run directory, or None if ``path`` is not one."""
    try:
        names = set(os.listdir(path))
    except OSError:
        return None
    if "ckpts" in names and os.path.isdir(os.path.join(path, "ckpts")):
        return "fast", False
    if names.intersection(RUN_MARKS):
        return ("fast" if names.intersection(("ckpt.log", "last", "best", "lock")) else "persistent"), True
    return None


def _local_sources(root: str) -> list[Source]:
    if any(c in root for c in "*?["):
        matches = sorted(glob.glob(root))
        if not matches:
            raise CliError(f"{root}: the pattern matches nothing; {EXPECTED}")
        runs = [(m, _local_kind(m)) for m in matches]
        return [Source(_run_id(m), m, None, *k) for m, k in runs if k is not None]
    if not os.path.exists(root):
        raise CliError(f"{root}: no such directory; {EXPECTED}")
    if not os.path.isdir(root):
        raise CliError(f"{root} is a file, not a directory; {EXPECTED}")
    kind = _local_kind(root)
    if kind is not None:
        return [Source(_run_id(root), root, None, *kind)]
    found = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        kind = _local_kind(entry.path) if entry.is_dir() else None
        if kind is not None:
            found.append(Source(entry.name, entry.path, None, *kind))
    return found


def _run_id(path: str) -> str:
    return os.path.basename(os.path.normpath(path))


def _remote_sources(root: str, options: dict[str, Any]) -> list[Source]:
    import fsspec.core

    text = json.dumps(options) if options else None

    try:
        fs, path = fsspec.core.url_to_fs(root, **options)
    except (ValueError, ImportError) as err:
        raise CliError(f"{root} cannot be opened with fsspec: {err}; {EXPECTED}") from None
    path = path.rstrip("/")
    if any(c in path for c in "*?["):
        return [Source(p.rstrip("/").rsplit("/", 1)[-1], p, fs, options=text) for p in sorted(fs.glob(path))]
    try:
        entries = fs.ls(path, detail=True)  # the campaign's one listing of its runs
    except FileNotFoundError:
        raise CliError(f"{root}: no such directory; {EXPECTED}") from None
    names = {e["name"].rstrip("/").rsplit("/", 1)[-1]: e for e in entries}
    if names.keys() & set(RUN_MARKS):
        return [Source(path.rsplit("/", 1)[-1], path, fs, options=text)]
    dirs = [(n, e["name"].rstrip("/")) for n, e in sorted(names.items()) if e.get("type") == "directory"]
    return [Source(n, p, fs, options=text) for n, p in dirs]


def find_sources(roots: list[str], options: dict[str, Any]) -> list[Source]:
    """Every run directory under ``roots`` (see the module's docstring); CliError for a ROOT that holds none."""
    found: list[Source] = []
    for root in roots:
        remote = "://" in root and not root.startswith("file://")
        sources = _remote_sources(root, options) if remote else _local_sources(root.removeprefix("file://"))
        if not sources:
            raise CliError(
                f"{root} holds no run directory (a directory with epochs/, steps/ or {H.HISTORY_FILE}, or a "
                f"ckpt_directory with ckpts/); {EXPECTED}"
            )
        found.extend(sources)
    return found


# -- reading one run -------------------------------------------------------------------------------


def commit_of(side: Sidecar) -> S.Commit:
    """What the state rules read of a sidecar."""
    upload = (side.extra.get("io") or {}).get("last_upload") if isinstance(side.extra.get("io"), dict) else None
    lag = upload.get("lag_s") if isinstance(upload, dict) else None
    limit = side.extra.get("epochs")
    return S.Commit(
        epoch=side.epoch,
        generation=side.generation,
        time=S.parse_timestamp(side.timestamp),
        reason=side.reason or "",
        step=side.step,
        time_elapsed=float(side.time_elapsed or 0.0),
        metric=side.save_best_metric,
        best=side.best_metric_last,
        best_epoch=side.best_epoch,
        mode=side.save_best_mode,
        limit=limit if isinstance(limit, int) and not isinstance(limit, bool) else None,
        finished=bool(side.extra.get("finished")),
        drain_lag_s=float(lag) if isinstance(lag, (int, float)) else None,
    )


def _first(numbers: list[int], read, facts: S.RunFacts) -> Sidecar | None:
    """The first sidecar ``read(number)`` gives, trying ``numbers`` in order; a missing one (being written) is
    passed over quietly, a bad one noted in ``facts.problems``."""
    for number in numbers:
        try:
            return read(number)
        except CorruptCheckpoint as err:
            if "missing" not in err.reason and "No such file" not in err.reason:  # not one being written
                facts.problems.append(f"{err.path}: {err.reason}")
        except CheckpointError as err:
            facts.problems.append(str(err))
    return None


def _newest(epoch_side: Sidecar | None, steps: list[int], read_step, facts: S.RunFacts) -> S.Commit | None:
    """The newer of the newest epoch checkpoint and the step checkpoints above it (GGG is their generation)."""
    floor = epoch_side.generation if epoch_side is not None else -1
    step_side = _first(sorted((g for g in steps if g > floor), reverse=True), read_step, facts)
    sides = [s for s in (epoch_side, step_side) if s is not None]
    return commit_of(max(sides, key=sort_key)) if sides else None


def read_local(src: Source) -> S.RunFacts:
    """One run's facts from a local directory (a persistent tier or a fast one)."""
    reader = CheckpointReader(src.path, flat=src.flat)
    facts = S.RunFacts(src.run, reader.layout.root, src.tier)
    epochs = sorted(reader.epochs(), reverse=True)
    side = _first(epochs, reader.read_sidecar, facts)
    last = reader.link_epoch("last") if src.tier == "fast" else None
    if last is not None and side is not None and last != side.epoch and last in epochs:
        other = _first([last], reader.read_sidecar, facts)
        side = max((s for s in (side, other) if s is not None), key=sort_key)
    steps = StepCheckpoints(reader)
    facts.newest = _newest(side, steps.generations(), steps.read_sidecar, facts)
    facts.history = H.read_local(reader.layout.history)
    if src.tier == "fast":
        facts.lineage_refusal = lineage_refusal(_tail(reader.layout.log))
    if facts.newest is None and not facts.history:
        lay = reader.layout
        facts.seen = max((_mtime(p) for p in (lay.root, lay.ckpts, lay.epochs, lay.steps, lay.work)), default=None)
    return facts


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - LOG_TAIL))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def lineage_refusal(log: str) -> str | None:
    """The drain's lineage refusal in ``ckpt.log``'s tail, if it came after the run's newest restart."""
    refused, restarted = -1, -1
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if LINEAGE_REFUSAL in line:
            refused = i
        elif RESTART_LINE in line:
            restarted = i
    if refused < 0 or refused < restarted:
        return None
    text = lines[refused].split(" failed: ", 1)[-1]
    return text.split("; refusing to overwrite it")[0]


def read_remote(src: Source) -> S.RunFacts:
    """One run's facts from an fsspec persistent directory: one listing, then the newest sidecars and history."""
    fs = src.fs
    listing = fs.find(src.path, detail=True)  # the run's one listing
    facts = S.RunFacts(src.run, fs.unstrip_protocol(src.path), src.tier)
    tier = PersistentTier(facts.path, src.options)  # fsspec hands back the campaign's file system (cached)
    held: dict[str, list[int]] = {EPOCHS: [], STEPS: []}
    prefix = src.path.rstrip("/") + "/"
    for name in listing:
        parts = name[len(prefix) :].split("/") if name.startswith(prefix) else []
        number = L.parse_epoch(parts[1]) if len(parts) == 3 and parts[0] in held else None
        if number is not None and parts[2] == L.SIDECAR:
            held[parts[0]].append(number)
    side = _first(sorted(held[EPOCHS], reverse=True), lambda n: tier.read_sidecar(EPOCHS, n), facts)
    facts.newest = _newest(side, held[STEPS], lambda n: tier.read_sidecar(STEPS, n), facts)
    if prefix + H.HISTORY_FILE in listing:
        facts.history = H.parse(fs.cat_file(prefix + H.HISTORY_FILE))
    if facts.newest is None and not facts.history:
        facts.seen = max((_stamp(info) for info in listing.values()), default=None)
    return facts


def _stamp(info: dict[str, Any]) -> float:
    value = info.get("LastModified") or info.get("mtime") or info.get("created") or 0.0
    return value.timestamp() if hasattr(value, "timestamp") else float(value)


def merge(copies: list[S.RunFacts]) -> S.RunFacts:
    """One run's copies (tiers, nodes) as one: the newest commit, the union of the histories."""
    if len(copies) == 1:
        return copies[0]

    def order(c: S.RunFacts) -> tuple[int, int, int]:
        n = c.newest
        return (-1, -1, -1) if n is None else (n.generation, n.epoch, n.step if n.step is not None else 1 << 62)

    live = max(copies, key=order)  # the copy holding the newest commit: a refusal counts only there (not on a
    # node the run has left)
    return S.RunFacts(
        run=copies[0].run,
        path=", ".join(c.path for c in copies),
        tier="+".join(sorted({c.tier for c in copies})),
        newest=live.newest,
        history=H.merge(*(c.history for c in copies)),
        lineage_refusal=live.lineage_refusal,
        seen=max((c.seen for c in copies if c.seen is not None), default=None),
        problems=[p for c in copies for p in c.problems],
    )


def read_campaign(roots: list[str], options: dict[str, Any] | None = None) -> list[S.RunFacts]:
    """Every run of ``roots``, by run id (the copies of one run merged)."""
    sources = find_sources(roots, options or {})
    remote = [s for s in sources if s.fs is not None]
    by_run: dict[str, list[S.RunFacts]] = {}
    facts = [read_local(s) for s in sources if s.fs is None]
    if remote:
        with ThreadPoolExecutor(max_workers=16) as pool:  # an object store answers in parallel
            facts += list(pool.map(read_remote, remote))
    for f in facts:
        by_run.setdefault(f.run, []).append(f)
    return [merge(copies) for _, copies in sorted(by_run.items())]


# -- the command --------------------------------------------------------------------------------


def cmd_campaign(args: argparse.Namespace) -> int:
    """``candle-ckpt campaign``: the table (or ``--json``) and the summary line; ``--plot`` / ``--html`` files."""
    options = _options(args.storage_options)
    runs = read_campaign(list(args.roots), options)
    now = time.time()
    rows = [S.row(f, now, args.stale_factor, args.stale_floor) for f in runs]
    info = S.summary(rows)
    shown = S.sort_rows([r for r in rows if not args.state or r["state"] in args.state], args.sort)
    if args.plot or args.html:
        from candle_ckpt.cli import campaign_report as R

        R.require_matplotlib_for(args)
        if args.plot:
            print(f"wrote {R.write_plot(runs, rows, info, args.plot, args.dpi)}")
        if args.html:
            print(f"wrote {R.write_html(runs, rows, shown, info, args.html, args.dpi, list(args.roots))}")
    if args.json:
        stale = {"factor": args.stale_factor, "floor_s": args.stale_floor}
        out = {"roots": list(args.roots), "now": now, "stale": stale, "summary": info, "runs": shown}
        print(json.dumps(out, indent=2, default=str))
        return EXIT_OK
    for line in S.table_lines(shown):
        print(line)
    print(S.summary_line(info))
    return EXIT_OK


def _options(text: str | None) -> dict[str, Any]:
    """``--storage-options``: a JSON object, or one line saying what it is instead."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as err:
        raise CliError(f"--storage-options must be a JSON object; {err}") from None
    if not isinstance(value, dict):
        raise CliError(f"--storage-options must be a JSON object; got {type(value).__name__}")
    return value


def add_options(p: argparse.ArgumentParser) -> None:
    """``campaign``'s arguments."""
    p.add_argument(
        "roots",
        metavar="ROOT",
        nargs="+",
        help="a campaign's persistent directory (a path or an fsspec URL), a run's directory, or a glob of "
        "ckpt_directory paths (quote it: the command expands it)",
    )
    p.add_argument("--sort", choices=S.SORT_KEYS, default="run", help="order of the rows (default: run)")
    p.add_argument("--state", action="append", choices=S.STATES, help="show only the runs in this state (repeatable)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of the table")
    p.add_argument("--plot", metavar="FILE", help="also draw each run's progress and best metric into FILE")
    p.add_argument("--html", metavar="FILE", help="also write one self-contained page: the table and the figures")
    p.add_argument("--dpi", type=_positive(int), default=100, help="resolution of the figures (default: 100)")
    p.add_argument(
        "--stale-factor",
        type=_positive(float),
        default=S.STALE_FACTOR,
        metavar="K",
        help=f"stale: nothing for K x the run's seconds per epoch (default: {S.STALE_FACTOR:g})",
    )
    p.add_argument(
        "--stale-floor",
        type=_positive(float),
        default=S.STALE_FLOOR_S,
        metavar="S",
        help=f"... and for at least S seconds (default: {S.STALE_FLOOR_S:g})",
    )
    p.add_argument("--storage-options", metavar="JSON", help="fsspec storage options of a URL, as ckpt_upload_options")


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be a number > 0; got {text!r}")
        return value

    return parse
