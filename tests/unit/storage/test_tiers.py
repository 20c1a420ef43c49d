"""Checkpoint tiers without a framework: the drain's policies, the lineage guard, the tier choice at restart,
the generation a pull keeps, and what each checkpoint costs the persistent tier (docs/campaigns.rst)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.errors import CheckpointUploadError, NoValidCheckpoint
from candle_ckpt.core.fs import LocalFS
from candle_ckpt.core.log import OpsLog
from candle_ckpt.engine.capture import Capture
from candle_ckpt.engine.engine import CheckpointEngine
from candle_ckpt.engine.resume import select_checkpoint
from candle_ckpt.storage.store import FileSpec


def capture(epoch: int, nfiles: int = 2) -> Capture:
    """``nfiles`` files whose bytes depend on ``epoch``."""

    def data(i: int) -> bytes:
        return bytes((epoch * 7 + i * 13 + k) % 251 for k in range(3000))

    files = [FileSpec(f"part{i}.bin", lambda f, i=i: f.write(data(i))) for i in range(nfiles)]
    return Capture(files=files, model_file="part0.bin", nbytes=3000 * nfiles)


def config(fast: Path, persistent: Path | str, **params) -> CkptConfig:
    return CkptConfig.from_params(
        {
            "ckpt_directory": str(fast),
            "ckpt_persistent_url": str(persistent),
            "ckpt_save_best_metric": "loss",
            "epochs": 100,
            **params,
        }
    )


class Run:
    """One life of a run: restore (tier choice), then save epochs through a real engine with its drain."""

    def __init__(self, fast: Path, persistent: Path | str, fs: LocalFS | None = None, **params) -> None:
        self.cfg = config(fast, persistent, **params)
        self.log = OpsLog(str(fast / "ckpt.log"))
        self.chosen = select_checkpoint(self.cfg, self.log, reads=())
        self.engine = CheckpointEngine(self.cfg, self.log, fs=fs)
        self.engine.adopt_resumed(self.chosen.sidecar if self.chosen else None)
        self.epoch = self.chosen.epoch if self.chosen else 0

    def train(self, until: int, nfiles: int = 2) -> None:
        while self.epoch < until:
            self.epoch += 1
            self.engine.save(self.epoch, {"loss": 1.0 / self.epoch}, lambda e=self.epoch: capture(e, nfiles))

    def end(self) -> None:
        self.engine.finish()
        self.engine.close()


def persistent(root: Path) -> dict[str, dict]:
    """``epochs/NNN`` -> its persistent sidecar, for every complete persistent checkpoint."""
    out = {}
    for kind in ("epochs", "steps"):
        for name in sorted(os.listdir(root / kind)) if (root / kind).is_dir() else []:
            side = root / kind / name / "ckpt-info.json"
            if side.exists():
                out[f"{kind}/{name}"] = json.loads(side.read_text())
    return out


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def tier_line(fast: Path) -> str:
    lines = [line for line in (fast / "ckpt.log").read_text().splitlines() if "restart: tier:" in line]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_pulled_checkpoint_keeps_its_generation_so_later_work_wins_at_every_move(tmp_path: Path) -> None:
    """A run moved to an empty fast tier four times resumes each time from the newest persistent checkpoint
    (the issue's campaign failure: a pulled checkpoint became generation 1 and later epochs lost to it)."""
    p = tmp_path / "P"
    run = Run(tmp_path / "node0", p)
    run.train(5)
    run.end()
    for move in range(1, 5):
        run = Run(tmp_path / f"node{move}", p)
        assert run.chosen is not None and run.chosen.epoch == 5 * move
        assert "restart: tier: persistent:" in tier_line(tmp_path / f"node{move}")
        run.train(5 * (move + 1))
        run.end()
    sides = persistent(p)
    by_epoch = sorted((s["epoch"], s["generation"]) for s in sides.values())
    assert [g for _, g in by_epoch] == sorted(g for _, g in by_epoch)  # generations grow with the epochs
    assert by_epoch[-1][0] == 25
    assert len({s["lineage"] for s in sides.values()}) == 1


def test_a_stale_fast_tier_never_wins_over_a_newer_persistent_checkpoint_nor_overwrites_it(tmp_path: Path) -> None:
    """Fast tier B is a copy of A at epoch 3; A goes on to 6. A run on B resumes from P's epoch 6, and P's
    epochs 4-6 are byte-identical afterwards."""
    import shutil

    p = tmp_path / "P"
    a = Run(tmp_path / "A", p)
    a.train(3)
    a.engine.finish()
    shutil.copytree(tmp_path / "A", tmp_path / "B", symlinks=True)
    a.train(6)
    a.end()
    before = snapshot(p)
    b = Run(tmp_path / "B", p)
    assert b.chosen.epoch == 6 and b.chosen.sidecar.generation == before_generation(before, 6)
    line = tier_line(tmp_path / "B")
    assert "restart: tier: persistent:" in line and "epochs/006" in line and "fast tier's epochs/003" in line
    b.end()
    assert snapshot(p) == before


def before_generation(files: dict[str, bytes], epoch: int) -> int:
    return json.loads(files[f"epochs/{epoch:03d}/ckpt-info.json"])["generation"]


def test_a_newer_fast_tier_wins_without_a_fetch_and_says_so(tmp_path: Path) -> None:
    """With ckpt_drain=interval the fast tier is ahead of P: restart uses it, fetches nothing, and says why."""
    p = tmp_path / "P"
    run = Run(tmp_path / "A", p, ckpt_drain="interval", ckpt_drain_interval=2)
    run.train(5)
    run.engine.remote.finish(60)  # drains the newest too (epoch 5): take it back out to stay behind
    run.engine.close()
    for name in ("ckpt-info.json", "ckpt.tar"):
        (p / "epochs" / "005" / name).unlink()
    again = Run(tmp_path / "A", p)
    assert again.chosen.epoch == 5
    line = tier_line(tmp_path / "A")
    assert "restart: tier: fast: the fast tier's epochs/005" in line and "has epochs/004" in line
    assert "it is not newer" in line
    assert "pulled" not in (tmp_path / "A" / "ckpt.log").read_text()
    again.end()


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("every", [1, 2, 3, 4, 5]),
        ("interval", [2, 4, 5]),  # every 2nd, and the last at the end
        ("preempt", [5]),  # only the newest, at the end
        ("end", [2, 5]),  # best (max mode: epoch 2) and last
    ],
)
def test_each_drain_policy_drains_what_it_says(tmp_path: Path, policy: str, expected: list[int]) -> None:
    """Five epoch commits, then the end of training: the persistent tier holds exactly the policy's epochs."""
    p = tmp_path / "P"
    run = Run(tmp_path / "A", p, ckpt_drain=policy, ckpt_drain_interval=2, ckpt_save_best_mode="max")
    run.epoch = 0
    for epoch, loss in zip(range(1, 6), [1.0, 9.0, 3.0, 2.0, 1.0], strict=True):
        run.engine.save(epoch, {"loss": loss}, lambda e=epoch: capture(e))
    run.end()
    assert sorted(int(k.split("/")[1]) for k in persistent(p)) == expected
    assert "drain: complete: epochs/005" in (tmp_path / "A" / "ckpt.log").read_text()


def test_an_exit_drains_the_newest_commit_once_and_never_after_a_finish(tmp_path: Path) -> None:
    """The interpreter-exit hook (Drain.at_exit): a commit no finish() was given (a fit that raised) is drained,
    said in one line; once finished (the end of training, a preemption's exit), the hook waits for nothing again."""
    p, fast = tmp_path / "P", tmp_path / "A"
    run = Run(fast, p, ckpt_drain="preempt")
    run.train(3)
    assert persistent(p) == {}  # "preempt" drains nothing during training
    run.engine.remote.at_exit(60)
    run.engine.remote.at_exit(60)
    assert list(persistent(p)) == ["epochs/003"]
    lines = [line for line in (fast / "ckpt.log").read_text().splitlines() if "exit: draining" in line]
    assert len(lines) == 1 and "epochs/003 (generation 3, epoch 3) to " in lines[0], lines
    run.train(4)
    run.engine.finish()
    run.engine.remote.at_exit(60)
    assert list(persistent(p)) == ["epochs/003", "epochs/004"]
    assert (fast / "ckpt.log").read_text().count("exit: draining") == 1


def test_an_exit_whose_drain_does_not_finish_in_time_says_so_and_returns(tmp_path: Path) -> None:
    """A persistent tier that stops answering: the exit hook waits its timeout, no longer, and says the newest
    checkpoint is not there and the process exits (a restart elsewhere resumes what the persistent tier has)."""
    p, fast = tmp_path / "P", tmp_path / "A"
    run = Run(fast, p, ckpt_drain="preempt")
    run.train(2)
    release = threading.Event()
    put = run.engine.remote.tier.put
    run.engine.remote.tier.put = lambda *a: release.wait(30) and put(*a)
    start = time.monotonic()
    run.engine.remote.at_exit(0.3)
    assert time.monotonic() - start < 10
    log = (fast / "ckpt.log").read_text()
    assert "drain: NOT complete after 0.3 s: epochs/002 (generation 2, epoch 2) is not yet in the persistent" in log
    assert "and this process exits now: a restart elsewhere resumes the newest checkpoint there" in log
    release.set()
    run.end()
    assert list(persistent(p)) == ["epochs/002"]


def test_another_lineage_in_the_persistent_tier_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    """A second run that did not resume (restart off) shares P by mistake: its drain refuses, names both
    lineages, and P is unchanged."""
    p = tmp_path / "P"
    first = Run(tmp_path / "A", p)
    first.train(2)
    first.end()
    before = snapshot(p)
    other = Run(tmp_path / "B", p, ckpt_restart_mode="off")
    with pytest.raises(CheckpointUploadError, match=r"refusing to overwrite it") as caught:
        other.train(2)
        other.engine.finish()
    lineage = json.loads(before["epochs/002/ckpt-info.json"])["lineage"]
    assert f"of lineage {lineage}, and this run is lineage {other.engine.lineage}" in str(caught.value)
    assert "ckpt_persistent_url" in str(caught.value)
    other.engine.close()
    assert snapshot(p) == before


def test_a_rollback_starts_a_new_lineage_and_does_not_rewrite_the_persistent_history(tmp_path: Path) -> None:
    """ckpt_restart_epoch=2 rolls back: its new epoch 3 is another lineage, so P's epoch 3 is not replaced."""
    p = tmp_path / "P"
    run = Run(tmp_path / "A", p)
    run.train(4)
    run.end()
    before = snapshot(p)
    back = Run(tmp_path / "A", p, ckpt_restart_epoch=2, ckpt_on_error="warn")
    assert back.chosen.epoch == 2
    back.train(3)
    back.end()
    assert snapshot(p) == before
    assert "refusing to overwrite it" in (tmp_path / "A" / "ckpt.log").read_text()


def test_required_mode_names_both_tiers_when_neither_has_a_checkpoint(tmp_path: Path) -> None:
    """ckpt_restart_mode=required with two empty tiers raises, naming the fast and the persistent tier."""
    cfg = config(tmp_path / "A", tmp_path / "P", ckpt_restart_mode="required")
    with pytest.raises(NoValidCheckpoint, match=r"no valid checkpoint in .*A or .*P"):
        select_checkpoint(cfg, OpsLog(None), reads=())


def test_a_corrupt_persistent_archive_is_skipped_for_the_fast_tier(tmp_path: Path) -> None:
    """P's newest archive has a flipped byte: restart says so and resumes from the fast tier's older one."""
    p = tmp_path / "P"
    run = Run(tmp_path / "A", p)
    run.train(3)
    run.end()
    stale = tmp_path / "B"
    import shutil

    shutil.copytree(tmp_path / "A", stale, symlinks=True)
    shutil.rmtree(stale / "ckpts" / "epochs" / "003")
    (stale / "ckpts" / "last").unlink()
    os.symlink("epochs/002", stale / "ckpts" / "last")
    tar = p / "epochs" / "003" / "ckpt.tar"
    raw = bytearray(tar.read_bytes())
    raw[1000] ^= 0xFF
    tar.write_bytes(bytes(raw))
    again = Run(stale, p)
    assert again.chosen.epoch == 2
    log = (stale / "ckpt.log").read_text()
    assert "cannot use epochs/003" in log and "the sidecar recorded" in log
    assert "its newer ones could not be fetched" in tier_line(stale)
    again.end()


class CountingFS(LocalFS):
    """The fast tier's file-system seam, counting each operation."""

    def __init__(self) -> None:
        self.ops: Counter[str] = Counter()

    def hook(self, op: str, path: str) -> None:
        self.ops[op] += 1


@pytest.mark.parametrize("nfiles", [2, 8])
def test_each_checkpoint_costs_the_persistent_tier_two_files_whatever_its_size(tmp_path: Path, nfiles: int) -> None:
    """Per drained checkpoint: 2 files created (archive, sidecar), 3 fsyncs, 2 metadata operations, whatever
    the number of files in the checkpoint; the fast tier's cost grows with it (figures in docs/campaigns.rst)."""
    fs = CountingFS()
    run = Run(tmp_path / "A", tmp_path / "P", fs=fs, ckpt_keep_limit=1000)
    run.train(1, nfiles)
    run.engine.finish()
    first = dict(fs.ops)
    run.train(4, nfiles)
    run.end()
    records = run.engine.remote.records
    assert [r["epoch"] for r in records] == [1, 2, 3, 4]
    steady = [{k: v for k, v in r["ops"].items() if k != "bytes_written"} for r in records[1:]]
    assert steady == [{"metadata_ops": 2, "files_created": 2, "fsyncs": 3}] * 3
    fast = {k: (fs.ops[k] - first.get(k, 0)) / 3 for k in fs.ops}
    print(f"fast tier per checkpoint with {nfiles} files: {dict(sorted(fast.items()))}")
    assert fast["create"] == nfiles + 1  # every file and the sidecar
    assert all(r["lag_s"] is not None and r["lag_s"] >= 0 for r in records)
