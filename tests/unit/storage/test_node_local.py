"""The multi-part commit when each rank's ``ckpt_directory`` is its own (node-local): ranks are threads of a
ThreadGroup, each with its own directory; asserted on disk (docs/campaigns.rst, "Multi-process jobs on node-local
disks")."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from shardkit import rank_part, run_ranks, sidecar_template, state_for

from candle_ckpt.core.errors import CheckpointSaveError
from candle_ckpt.core.group import Group
from candle_ckpt.storage.commit import FileSpec
from candle_ckpt.storage.multipart import (
    NODE_LOCAL,
    NodePart,
    SharedSave,
    hear_work_ready,
    node_local_word,
    write_rank_part,
)
from candle_ckpt.storage.reader import CheckpointReader
from candle_ckpt.storage.sharded import MANIFEST
from candle_ckpt.storage.shardread import ShardedReader
from candle_ckpt.storage.store import CheckpointStore
from candle_ckpt.testing.groups import ThreadGroup


def save(dirs: list[Path], epoch: int) -> list[Any]:
    """Every rank saves ``epoch``; rank r writes into ``dirs[r]`` (the same path twice: a shared directory)."""
    hub = ThreadGroup(len(dirs))
    stores = [CheckpointStore(d) for d in dirs]
    stores[0].open_for_write()
    arrays, key = state_for(epoch), f"save/{epoch}"

    def work(g: Group) -> Any:
        part = rank_part(arrays, g.rank, g.size)
        if g.rank == 0:
            shared = SharedSave(g, key, part, {p: "rows" for p in arrays}, timeout_s=30)
            files = [FileSpec("config.json", lambda f: f.write(b"{}"))]
            return stores[0].commit(epoch, files, sidecar_template(), best_epoch=epoch, shared=shared)
        store = stores[g.rank]
        word = hear_work_ready(g, key, 30)
        generation = node_local_word(store.layout, word)
        if generation is None:
            return write_rank_part(store.layout, g, key, part, timeout_s=30, heard=word)
        if not store.is_open:
            store.open_for_write()
        store.use_generation(generation)
        return store.commit(epoch, [], sidecar_template(), best_epoch=epoch, shared=NodePart(g, key, part, 30))

    try:
        return run_ranks(hub, work)
    finally:
        for store in stores:
            store.close()


def test_each_rank_commits_its_own_copy_under_one_generation(tmp_path: Path) -> None:
    """Three ranks, three directories, two epochs: each copy verifies, holds the same manifest and generation, its
    own part only, and reads back its own rows exactly; the primary's sidecar lists every rank's files."""
    dirs = [tmp_path / f"node{r}" for r in range(3)]
    for epoch in (1, 2):
        results = save(dirs, epoch)
        assert all(not isinstance(r, BaseException) for r in results), results
        assert {r.generation for r in results} == {epoch}
    manifests = set()
    for rank, d in enumerate(dirs):
        reader = CheckpointReader(d)
        assert reader.epochs() == [1, 2] and reader.link_epoch("last") == 2
        side, _ = reader.verify(2)
        assert side.extra[NODE_LOCAL]["rank"] == rank and side.extra[NODE_LOCAL]["processes"] == 3
        where = reader.layout.epoch_dir(2)
        names = set(os.listdir(where))
        assert f"part-{rank:05d}.bin" in names and not {f"part-{r:05d}.bin" for r in range(3) if r != rank} & names
        manifests.add(Path(where, MANIFEST).read_bytes())
        with ShardedReader(where) as shards:
            for path, array in state_for(2).items():
                for part, index, _, _ in shards.variables[path].chunks:  # this rank's chunks, from its own part
                    if part == rank:
                        want = array[tuple(slice(a, b) for a, b in index)]
                        assert shards.read(path, index).tobytes() == want.tobytes(), path
    assert len(manifests) == 1
    primary = json.loads((dirs[0] / "ckpts" / "epochs" / "002" / "ckpt-info.json").read_text())
    every = set(primary["extra"][NODE_LOCAL]["files"])
    assert {"config.json", MANIFEST} | {f"part-{r:05d}.bin" for r in range(3)} <= every


def test_a_mix_of_shared_and_own_directories_is_refused_everywhere(tmp_path: Path) -> None:
    """Rank 1 shares the primary's directory, rank 2 has its own: every rank raises, the primary naming both,
    and nothing is published anywhere."""
    dirs = [tmp_path / "shared", tmp_path / "shared", tmp_path / "node2"]
    results = save(dirs, 1)
    assert all(isinstance(r, CheckpointSaveError) for r in results), results
    assert "processes [1] share the primary's directory and processes [2] do not" in str(results[0])
    for d in (dirs[0], dirs[2]):
        assert CheckpointReader(d).epochs() == []


def test_a_shared_directory_is_the_commit_of_before(tmp_path: Path) -> None:
    """Every rank in one directory: one checkpoint listing every part, no node_local mark, no marker left."""
    results = save([tmp_path] * 2, 1)
    assert results[1] == "epochs/001", results
    side, _ = CheckpointReader(tmp_path).verify(1)
    assert NODE_LOCAL not in side.extra and {"part-00000.bin", "part-00001.bin"} <= set(side.files)
    assert sorted(os.listdir(CheckpointReader(tmp_path).layout.epoch_dir(1))) == sorted([*side.files, "ckpt-info.json"])


# -- restore: the tier meeting and the choice (engine.node_restore imports no framework) ----------------------------


def drain_all(dirs: list[Path], url: Path, epoch: int) -> None:
    """What every rank's drain does for ``epoch``: its archive; then the primary's manifest and sidecar."""
    from candle_ckpt.storage.remote import EPOCHS, PersistentTier  # noqa: PLC0415 (fsspec)

    tier = PersistentTier(str(url))
    for d in reversed(dirs):  # the primary last: it publishes once every archive is there
        where = CheckpointReader(d).layout.epoch_dir(epoch)
        side = CheckpointReader(d).read_sidecar(epoch)
        tier.put_part(EPOCHS, side, where, side.extra[NODE_LOCAL]["rank"])
    assert tier.missing_parts(EPOCHS, side, len(dirs)) == []
    tier.publish_parts(EPOCHS, side, where)


def restore(dirs: list[Path], url: Path | None, caplog) -> list[Any]:
    """Every rank's tier meeting and choice, verified on its own directory: ``(tier word, epoch restored)``."""
    import logging  # noqa: PLC0415

    from candle_ckpt.config.params import CkptConfig  # noqa: PLC0415
    from candle_ckpt.core.log import OpsLog  # noqa: PLC0415
    from candle_ckpt.engine import node_restore  # noqa: PLC0415
    from candle_ckpt.engine.resume import Chosen  # noqa: PLC0415

    def work(g: Group) -> Any:
        params = {"ckpt_directory": str(dirs[g.rank])} | ({"ckpt_persistent_url": str(url)} if url else {})
        cfg = CkptConfig.from_params(params)
        log = OpsLog(None, logging.getLogger("candle_ckpt.test_node_local"))

        def verify(said: str) -> Chosen:
            _, epoch, generation = said.split(":")
            side, contents = CheckpointStore(cfg.directory).verify(int(epoch))
            assert side.generation == int(generation)
            return Chosen(int(epoch), side, contents)

        word, decision = node_restore.meet(cfg, log, g, "restore/0", steps=True, wanted=None)
        if word == node_restore.SHARED:
            return word, None
        chosen = node_restore.agree_node_local(cfg, log, g, "restore/0", word, decision, verify)
        return word.split()[0], chosen.epoch if chosen else None

    with caplog.at_level("INFO", logger="candle_ckpt.test_node_local"):
        return run_ranks(ThreadGroup(len(dirs)), work)


def two_nodes(tmp_path: Path) -> tuple[list[Path], Path]:
    """Two node-local directories holding epochs 1 and 2, both drained into ``P``."""
    dirs, url = [tmp_path / "node0", tmp_path / "node1"], tmp_path / "P"
    for epoch in (1, 2):
        save(dirs, epoch)
        drain_all(dirs, url, epoch)
    return dirs, url


def test_restore_takes_the_fast_tiers_when_every_node_holds_the_newest(tmp_path: Path, caplog) -> None:
    """Both nodes hold epoch 2, as the persistent tier does: the fast tiers win the tie; nothing is pulled."""
    dirs, url = two_nodes(tmp_path)
    assert restore(dirs, url, caplog) == [("local", 2), ("local", 2)]
    assert "restart: tier: fast: the fast tiers' epochs/002" in caplog.text


def test_restore_pulls_every_part_when_one_node_is_empty_or_stale(tmp_path: Path, caplog) -> None:
    """Node 1 lost epoch 2 (stale), then everything (a new node): the persistent epoch 2 wins both times, node 1
    fetches its own part (and only it) and every copy verifies."""
    import shutil  # noqa: PLC0415

    dirs, url = two_nodes(tmp_path)
    shutil.rmtree(CheckpointReader(dirs[1]).layout.epoch_dir(2))
    assert restore(dirs, url, caplog) == [("persistent", 2), ("persistent", 2)]
    assert "is newer than the fast tiers' epochs/001 (generation 1, epoch 1), held by every process" in caplog.text
    shutil.rmtree(dirs[1])
    caplog.clear()
    assert restore(dirs, url, caplog) == [("persistent", 2), ("persistent", 2)]
    assert "process 1: nothing" in caplog.text
    names = set(os.listdir(CheckpointReader(dirs[1]).layout.epoch_dir(2)))
    assert names == {"ckpt-info.json", MANIFEST, "part-00001.bin", "part-00001.json", "train.state.p00001.npz"}


def test_a_damaged_archive_falls_back_together(tmp_path: Path, caplog) -> None:
    """Node 1 is empty and its archive of epoch 2 is damaged: its pull fails, the primary rejects epoch 2 and
    both restore the persistent epoch 1."""
    import shutil  # noqa: PLC0415

    dirs, url = two_nodes(tmp_path)
    shutil.rmtree(dirs[1])
    archive = url / "epochs" / "002" / "part-00001.g000002.tar"
    import tarfile  # noqa: PLC0415

    with tarfile.open(archive) as tar:
        at = tar.getmembers()[0].offset_data  # the first member's data (after its PAX header)
    raw = bytearray(archive.read_bytes())
    raw[at] ^= 0xFF
    archive.write_bytes(bytes(raw))
    assert restore(dirs, url, caplog) == [("persistent", 1), ("persistent", 1)]
    assert "persistent epoch rejected: process 1:" in caplog.text


def test_restore_refuses_a_mix_of_shared_and_own_directories(tmp_path: Path, caplog) -> None:
    """Rank 1 shares the primary's directory, rank 2 has its own: every rank raises, naming who shares it."""
    from candle_ckpt.core.errors import NoValidCheckpoint  # noqa: PLC0415

    results = restore([tmp_path / "a", tmp_path / "a", tmp_path / "b"], None, caplog)
    assert all(isinstance(r, NoValidCheckpoint) for r in results), results
    assert "processes [0, 1] share it, the others do not" in str(results[0])
    assert not os.listdir(tmp_path / "a")  # the markers are gone
