"""Remote copies (ckpt_upload_url) against a real S3-compatible server on localhost, and memory:// / file://.

The S3 server is moto's standalone server (``ThreadedMotoServer``) bound to
127.0.0.1 on a free port; the library talks to it through s3fs over HTTP,
configured with ``ckpt_upload_options`` (endpoint and test credentials).
"""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import fsspec  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import runner_loops as RL  # noqa: E402

from candle_ckpt import CandleCheckpointCallback, restart  # noqa: E402
from candle_ckpt.core.errors import CheckpointUploadError  # noqa: E402
from candle_ckpt.storage import store  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on localhost; yields (storage options JSON, s3fs filesystem)."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"},
    }
    import boto3

    boto3.client(
        "s3",
        endpoint_url=options["client_kwargs"]["endpoint_url"],
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket="ckpt-bucket")
    fs = fsspec.filesystem("s3", **options)
    yield json.dumps(options), fs
    server.stop()


def s3_params(s3, directory: Path, prefix: str, epochs: int, **overrides):
    options, _ = s3
    return RL.params(
        str(directory), epochs, ckpt_upload_url=f"s3://ckpt-bucket/{prefix}", ckpt_upload_options=options, **overrides
    )


def run_loop(p: dict, loop: RL.GanLoop | None = None):
    from candle_ckpt import JobRunner

    loop = loop or RL.GanLoop()
    runner = JobRunner(p, init_fn=loop.init, epoch_fn=loop.epoch, objects=loop.objects(), state=loop.state, logger=None)
    runner.train()
    return loop, runner


def test_s3_uploads_then_empty_dir_restarts_from_remote(tmp_path: Path, s3) -> None:
    """Every commit lands on the S3 server; a new machine (empty dir) pulls the newest and resumes bit for bit."""
    _, fs = s3
    first, runner = run_loop(s3_params(s3, tmp_path / "a", "job1", 3))
    fs.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls("ckpt-bucket/job1/epochs")) == ["000", "001", "002", "003"]
    assert fs.exists("ckpt-bucket/job1/epochs/003/ckpt-info.json")
    uploads = runner.stats()["uploads"]
    assert [u["epoch"] for u in uploads] == [0, 1, 2, 3]
    assert all(u["upload_s"] > 0 and u["mb_per_s"] > 0 for u in uploads)
    log = (tmp_path / "a" / "ckpt.log").read_text()
    assert "drain: epochs/003 (generation 4, epoch 3) to s3://ckpt-bucket/job1/epochs/003" in log
    assert "drain: complete: epochs/003 (generation 4, epoch 3) is in the persistent tier" in log
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls("ckpt-bucket/job1/epochs/003")) == ["ckpt-info.json", "ckpt.tar"]

    second, runner2 = run_loop(s3_params(s3, tmp_path / "fresh", "job1", 3))
    assert runner2.resumed_from == 3 and second.init_calls == 0
    want, got = first.final_arrays(), second.final_arrays()  # each call draws from the numpy generator
    assert [k for k in want if not np.array_equal(want[k], got[k])] == []
    side = json.loads((tmp_path / "fresh" / "ckpts" / "epochs" / "003" / "ckpt-info.json").read_text())
    assert side["extra"]["pulled_from"] == "s3://ckpt-bucket/job1/epochs/003"
    log = (tmp_path / "fresh" / "ckpt.log").read_text()
    assert "remote: pulled epochs/003" in log
    assert side["generation"] == 4  # its place in the lineage survives the pull
    assert "restart: tier: persistent: s3://ckpt-bucket/job1 epochs/003 (generation 4, epoch 3) is newer than" in log


def test_remote_checkpoint_visible_only_once_complete(tmp_path: Path, s3) -> None:
    """While the sidecar upload is held back, the data files are on S3 but a fresh restart ignores the epoch."""
    from candle_ckpt import JobRunner
    from candle_ckpt.config.params import CkptConfig
    from candle_ckpt.storage.pull import pull_newest

    _, fs = s3
    loop = RL.GanLoop()
    p = s3_params(s3, tmp_path / "a", "job2", 2)
    runner = JobRunner(p, epoch_fn=loop.epoch, objects=loop.objects(), state=loop.state, logger=None)
    release, blocked = threading.Event(), threading.Event()
    original = None
    puts: list[str] = []  # remote paths in the order the drain wrote them

    def hold_sidecar_of_epoch_2(rpath, mode="rb", *args, **kwargs):
        if "w" in mode:
            puts.append(rpath)
        if "w" in mode and rpath.endswith("epochs/002/ckpt-info.json"):
            blocked.set()
            release.wait(60)
        return original(rpath, mode, *args, **kwargs)

    def train():
        runner.train()

    # The drain is made with the engine inside train(): patch its filesystem as soon as it exists.
    from candle_ckpt.storage import drain as drain_mod

    real_init = drain_mod.Drain.__init__

    def init(self, *args, **kwargs):
        nonlocal original
        real_init(self, *args, **kwargs)
        original = self.tier.fs.open
        self.tier.fs = _Wrapped(self.tier.fs, hold_sidecar_of_epoch_2)

    drain_mod.Drain.__init__ = init
    try:
        t = threading.Thread(target=train)
        t.start()
        assert blocked.wait(120)
        fs.invalidate_cache()
        files = sorted(x.rsplit("/", 1)[-1] for x in fs.ls("ckpt-bucket/job2/epochs/002"))
        assert files == ["ckpt.tar"]  # the archive is there, the sidecar not yet
        cfg = CkptConfig.from_params({**p, "ckpt_directory": str(tmp_path / "peek")})
        peek = store.CheckpointStore(cfg.directory)
        from candle_ckpt.core.log import OpsLog

        assert pull_newest(cfg, peek, OpsLog(str(tmp_path / "peek.log"))).epoch == 1  # epoch 2 is not complete yet
        peek.close()
        release.set()
        t.join(120)
    finally:
        drain_mod.Drain.__init__ = real_init
        release.set()
    fs.invalidate_cache()
    assert fs.exists("ckpt-bucket/job2/epochs/002/ckpt-info.json")
    for epoch in ("000", "001", "002"):
        of_epoch = [path for path in puts if f"epochs/{epoch}/" in path]
        assert [p.rsplit("/", 1)[-1] for p in of_epoch] == ["ckpt.tar", "ckpt-info.json"]  # 8 files in one archive


class _Wrapped:
    """Delegates to an fsspec filesystem, routing open through ``open``."""

    def __init__(self, fs, open_) -> None:
        self._fs = fs
        self.open = open_

    def __getattr__(self, name):
        return getattr(self._fs, name)


@pytest.mark.parametrize("mode", ["raise", "warn"])
def test_upload_failure_follows_ckpt_on_error(tmp_path: Path, s3, mode: str) -> None:
    """Uploads to a missing bucket fail: 'raise' stops the job, 'warn' logs it and finishes training."""
    options, _ = s3
    p = RL.params(
        str(tmp_path / "a"),
        2,
        ckpt_upload_url="s3://no-such-bucket/job",
        ckpt_upload_options=options,
        ckpt_on_error=mode,
    )
    if mode == "raise":
        with pytest.raises(CheckpointUploadError, match=r"checkpoint upload failed"):
            run_loop(p)
    else:
        _, runner = run_loop(p)
        assert runner.epoch == 2
        assert runner.stats()["errors"] and "upload failed" in runner.stats()["errors"][0]
        assert "ckpt_on_error=warn" in (tmp_path / "a" / "ckpt.log").read_text()
    # the local checkpoints are intact either way
    assert "000" in os.listdir(tmp_path / "a" / "ckpts" / "epochs")


def build_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


def fit_params(directory: Path, url: str, **overrides) -> dict:
    p = {
        "epochs": 3,
        "ckpt_directory": str(directory),
        "ckpt_save_best_metric": "loss",
        "ckpt_upload_url": url,
    }
    p.update(overrides)
    return p


def test_callback_file_url_and_restart_pulls(tmp_path: Path) -> None:
    """model.fit with the callback mirrors to file://; restart() on an empty dir pulls the newest and loads it."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 8)).astype("float32"), rng.standard_normal((32, 1)).astype("float32")
    url = (tmp_path / "remote").as_uri()
    model = build_model()
    cb = CandleCheckpointCallback(fit_params(tmp_path / "a", url), logger=None)
    model.fit(x, y, epochs=3, batch_size=8, shuffle=False, callbacks=[cb], verbose=0)
    assert [u["epoch"] for u in cb.stats()["uploads"]] == [1, 2, 3]
    assert (tmp_path / "remote" / "epochs" / "003" / "ckpt-info.json").exists()
    fresh = build_model()
    info = restart(fit_params(tmp_path / "b", url), fresh, logger=None)
    assert info["epoch"] == 3
    want = model.variables + model.optimizer.variables
    got = fresh.variables + fresh.optimizer.variables
    assert [i for i, (a, b) in enumerate(zip(want, got, strict=True)) if not np.array_equal(a.numpy(), b.numpy())] == []


def test_mode_end_uploads_best_and_last_only(tmp_path: Path) -> None:
    """ckpt_upload_mode=end uploads nothing during training, then best and last at train end (memory://)."""
    model = build_model()
    x = np.ones((16, 8), "float32")
    y = np.concatenate([np.zeros((8, 1)), np.ones((8, 1))]).astype("float32")
    url = f"memory://{tmp_path.name}-end"
    # mode max on a falling loss: best is the first epoch, last the fourth, so they differ
    p = fit_params(tmp_path / "a", url, ckpt_upload_mode="end", epochs=4, ckpt_save_best_mode="max")
    cb = CandleCheckpointCallback(p, logger=None)

    class Spy(keras.callbacks.Callback):
        seen: list[int] = []

        def on_epoch_end(self, epoch, logs=None):
            Spy.seen.append(len(cb.stats()["uploads"]))

    model.fit(x, y, epochs=4, batch_size=4, callbacks=[cb, Spy()], verbose=0)
    assert Spy.seen == [0, 0, 0, 0]
    lay = store.CheckpointStore(tmp_path / "a")
    expected = {lay.link_epoch("best"), lay.link_epoch("last")}
    assert len(expected) == 2
    assert {u["epoch"] for u in cb.stats()["uploads"]} == expected
    fs = fsspec.filesystem("memory")
    assert {int(p.rsplit("/", 1)[-1]) for p in fs.ls(f"/{tmp_path.name}-end/epochs", detail=False)} == expected


def test_corrupt_remote_file_is_detected_after_download(tmp_path: Path) -> None:
    """A remote file whose bytes changed fails its CRC after download; the next older remote one is used."""
    model = build_model()
    x, y = np.ones((16, 8), "float32"), np.ones((16, 1), "float32")
    url = f"memory://{tmp_path.name}-crc"
    cb = CandleCheckpointCallback(fit_params(tmp_path / "a", url, ckpt_save_weights_only=True), logger=None)
    model.fit(x, y, epochs=3, batch_size=8, callbacks=[cb], verbose=0)
    fs = fsspec.filesystem("memory")
    path = f"/{tmp_path.name}-crc/epochs/003/ckpt.tar"
    raw = bytearray(fs.cat_file(path))
    raw[-10] ^= 0xFF
    fs.pipe_file(path, bytes(raw))
    info = restart(fit_params(tmp_path / "b", url), build_model(), logger=None)
    assert info["epoch"] == 2
    log = (tmp_path / "b" / "ckpt.log").read_text()
    assert "cannot use epochs/003" in log and "the sidecar recorded" in log


def test_unknown_protocol_is_named(tmp_path: Path) -> None:
    """A URL whose protocol fsspec does not know is refused when the callback is created, naming the key."""
    with pytest.raises(ValueError, match=r"ckpt_upload_url 'nosuchproto://x' cannot be opened"):
        CandleCheckpointCallback(fit_params(tmp_path / "a", "nosuchproto://x"), logger=None)
