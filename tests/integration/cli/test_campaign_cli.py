"""``candle-ckpt campaign`` (issue 47, item 1) on real campaign runs and on synthetic runs in every state.

The real runs follow docs/campaigns.rst's recipe (a fast tier of the run's own, ``ckpt_persistent_url`` =
``campaign/<run id>``, ``ckpt_keep_limit=2``), one process per life: run-0001 trains to its end; run-0002 is
killed with SIGKILL on "node-a" after two epochs and restarted on "node-b" on an empty fast tier; run-0003 gets
SIGTERM in its third epoch (a preemption save, exit 143). Each life names its node through
``socket.gethostname`` (every life runs on this machine); ``restart()`` writes the restart history. The
synthetic runs (``candle_ckpt.testing.campaign``) set up the states that take hours: stale, failed, refused.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from doclines import DOC_JOB, DOCS, console_examples, matches
from locations import REPO

from candle_ckpt.cli.campaign_state import STATES
from candle_ckpt.testing.campaign import half_written, write_run

ENV = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")

JOB = r"""
import os, signal, socket, sys
socket.gethostname = lambda: os.environ["CAMPAIGN_NODE"]  # the node this life runs on
import keras
import numpy as np
import candle_ckpt as candle

run_id, fast, stop = sys.argv[1], sys.argv[2], sys.argv[3]  # stop: "-", "kill:E" or "term:E" (epoch index)
gParameters = {
    "epochs": 4,
    "ckpt_directory": fast,  # the fast tier
    "ckpt_persistent_url": os.path.join("campaign", run_id),  # the persistent tier: the run's own directory
    "ckpt_keep_limit": 2,
}
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")
y = x @ rng.normal(size=(8, 1)).astype("float32")
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
J = candle.restart(gParameters, model)
kind, _, at = stop.partition(":")

class Stop(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        if kind == "kill" and epoch == int(at):
            os.kill(os.getpid(), signal.SIGKILL)
    def on_train_batch_end(self, batch, logs=None):
        if kind == "term" and self.epoch == int(at) and batch == 1:
            os.kill(os.getpid(), signal.SIGTERM)

ckpt = candle.CandleCheckpointCallback(gParameters)
initial = J["epoch"] if J else 0
model.fit(x, y, validation_split=0.25, epochs=4, initial_epoch=initial, callbacks=[ckpt, Stop()], verbose=0)
ckpt.report_final()
"""


def campaign(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``candle-ckpt campaign ARGS`` as a user runs it, in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "candle_ckpt", "campaign", *args],
        cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def lives(folder: Path, plan: list[tuple[str, str, str, str]]) -> dict[str, int]:
    """Start every ``(run, fast tier, node, stop)`` life of ``plan`` at once in ``folder``; their exit statuses."""
    procs = {}
    for run, fast, node, stop in plan:
        log = open(folder / f"{run}-{node}.out", "w")  # noqa: SIM115 (closed with the process below)
        env = {**ENV, "CAMPAIGN_NODE": node}
        cmd = [sys.executable, "job.py", run, str(folder / fast / run), stop]
        procs[f"{run}@{node}"] = (subprocess.Popen(cmd, cwd=folder, env=env, stdout=log, stderr=log), log)
    codes = {}
    for name, (proc, log) in procs.items():
        codes[name] = proc.wait(timeout=600)
        log.close()
    return codes


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> Path:
    """Three runs of the recipe: one done, one killed on node-a and moved to node-b, one preempted."""
    folder = tmp_path_factory.mktemp("campaign")
    (folder / "job.py").write_text(JOB)
    first = lives(
        folder,
        [("run-0001", "node-a", "node-a", "-"), ("run-0002", "node-a", "node-a", "kill:2"),
         ("run-0003", "node-a", "node-a", "term:2")],
    )  # fmt: skip
    assert first == {"run-0001@node-a": 0, "run-0002@node-a": -signal.SIGKILL, "run-0003@node-a": 143}, (
        first,
        (folder / "run-0003-node-a.out").read_text()[-3000:],
    )
    second = lives(folder, [("run-0002", "node-b", "node-b", "-")])  # an empty fast tier on another node
    assert second == {"run-0002@node-b": 0}, (folder / "run-0002-node-b.out").read_text()[-3000:]
    return folder


def test_real_runs_done_moved_and_preempted(real: Path) -> None:
    """The persistent view: run-0001 done, run-0002 done after 1 restart and 1 move, run-0003 preempted at a step
    checkpoint; every number read from the sidecars the runs wrote."""
    proc = campaign("./campaign", "--json", cwd=real)
    assert proc.returncode == 0, proc.stderr
    runs = {r["run"]: r for r in json.loads(proc.stdout)["runs"]}
    assert {k: (r["state"], r["restarts"], r["moves"]) for k, r in runs.items()} == {
        "run-0001": ("done", 0, 0),
        "run-0002": ("done", 1, 1),
        "run-0003": ("preempted", 0, 0),
    }
    assert runs["run-0001"]["epoch"] == 4 and runs["run-0001"]["epochs"] == 4
    assert runs["run-0003"]["step"] is not None and runs["run-0003"]["epoch"] == 2
    assert all(r["metric"] == "val_loss" and r["best_epoch"] is not None for r in runs.values())


def test_the_fast_tiers_as_a_glob_are_the_same_runs_merged_with_their_persistent_copy(real: Path) -> None:
    """A glob of the nodes' fast tiers alone, then with the persistent directory: one row per run id, node-b's
    fast tier of run-0002 as new as its persistent copy."""
    alone = json.loads(campaign("node-*/run-*", "--json", cwd=real).stdout)["runs"]
    assert [(r["run"], r["tier"]) for r in alone] == [
        ("run-0001", "fast"), ("run-0002", "fast"), ("run-0003", "fast"),
    ]  # fmt: skip
    both = json.loads(campaign("./campaign", "node-*/run-*", "--json", cwd=real).stdout)["runs"]
    assert [(r["run"], r["tier"], r["state"]) for r in both] == [
        ("run-0001", "fast+persistent", "done"),
        ("run-0002", "fast+persistent", "done"),
        ("run-0003", "fast+persistent", "preempted"),
    ]


def test_cli_rst_campaign_example_is_real_output(real: Path) -> None:
    """docs/cli.rst's campaign example, run in the folder of these real runs, prints the table and the summary line
    shown (numbers, ages and ids only have to be numbers)."""
    examples = [(c, e) for c, e in console_examples(DOCS / "cli.rst") if c.split()[:2] == ["candle-ckpt", "campaign"]]
    assert examples
    for command, expected in examples:
        proc = campaign(*command.split("#")[0].split()[2:], cwd=real)
        got = (proc.stdout + proc.stderr).replace(str(real), DOC_JOB).splitlines()
        # A run's DRAIN is "-" when the drain of the checkpoint before its newest had not finished when the newest
        # was saved (the next one records it): the page shows a lag for each, a real run may show either.
        got = [re.sub(r"(run-\d+ .*  )- *$", r"\g<1>0.00 s", line) for line in got]
        assert proc.returncode == 0 and matches(expected, got), (command, "\n".join(expected), "\n".join(got))


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    """One persistent run directory per state, the refused one with a half-written checkpoint and a cut line."""
    import time

    root = tmp_path_factory.mktemp("synthetic") / "campaign"
    now = time.time()
    for state in STATES:
        path = write_run(str(root), f"run-{state}", state, now)
    half_written(path, 9, now)
    return root


def test_every_state_in_the_table_the_summary_and_the_json(synthetic: Path) -> None:
    """Each synthetic run shows its state; the summary counts them and names the best run; --state filters,
    --sort orders; the half-written epoch 9 is passed over (the newest is epoch 6) without an error."""
    proc = campaign(str(synthetic), "--sort", "state", cwd=synthetic.parent)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["RUN", "STATE", "NEWEST"]
    assert [line.split()[1] for line in lines[1:-1]] == list(STATES)
    assert lines[-1] == (
        "7 runs: 1 done, 1 training, 1 stale, 1 refused (1 moved, 1 preempted, 1 failed); "
        "best val_loss 0.0909091 in run-done at epoch 10"
    )
    out = json.loads(campaign(str(synthetic), "--json", "--state", "stale", "--state", "refused", cwd=synthetic).stdout)
    assert [(r["run"], r["state"]) for r in out["runs"]] == [("run-refused", "refused"), ("run-stale", "stale")]
    assert out["summary"]["states"] == dict.fromkeys(STATES, 1)
    refused = out["runs"][0]
    assert (refused["epoch"], refused["restarts"], refused["moves"], refused["problems"]) == (6, 1, 1, [])


def test_html_page_holds_the_table_and_the_figure_and_plot_writes_a_png(synthetic: Path, tmp_path: Path) -> None:
    """--html writes one page with every run in its table and the figure inline; --plot writes a PNG."""
    pytest.importorskip("matplotlib")
    proc = campaign(str(synthetic), "--html", "c.html", "--plot", "c.png", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[:2] == [f"wrote {tmp_path / 'c.png'}", f"wrote {tmp_path / 'c.html'}"]
    page = (tmp_path / "c.html").read_text()
    assert '<table id="runs">' in page and "data:image/png;base64," in page and 'src="http' not in page
    assert all(f"<td>run-{s}</td>" in page for s in STATES)
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args, said",
    [
        (["nowhere"], "nowhere: no such directory; expected a campaign's persistent directory"),
        (["file.txt"], "file.txt is a file, not a directory; expected a campaign's persistent directory"),
        (["empty"], "empty holds no run directory (a directory with epochs/, steps/ or restarts.jsonl"),
        (["nodes/*/run-*"], "nodes/*/run-*: the pattern matches nothing; expected a campaign's persistent"),
        (["empty", "--storage-options", "[1]"], "--storage-options must be a JSON object; got list"),
        (["empty", "--stale-factor", "0"], "argument --stale-factor: must be a number > 0; got '0'"),
    ],
)
def test_bad_input_is_one_line_naming_the_path_and_what_was_expected(tmp_path: Path, args, said) -> None:
    """A ROOT that is no campaign (missing, a file, no run in it, a glob of nothing) or a bad option: one line on
    stderr, exit status 2, nothing on stdout."""
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "empty" / "logs").mkdir(parents=True)
    proc = campaign(*args, cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert len(proc.stderr.splitlines()) == 1 and said in proc.stderr, proc.stderr


def test_a_broken_newest_sidecar_falls_back_to_the_one_before_and_is_noted(synthetic: Path, tmp_path: Path) -> None:
    """A newest sidecar that fails its own CRC is not the run's newest: the older one is, the problem is in the
    JSON; a step directory without its sidecar (being drained) is passed over."""
    root = tmp_path / "c"
    shutil.copytree(synthetic / "run-training", root / "run-training")
    side = root / "run-training" / "epochs" / "006" / "ckpt-info.json"
    side.write_text(side.read_text().replace('"val_loss": 0.14', '"val_loss": 0.15'))
    (root / "run-training" / "steps" / "007").mkdir(parents=True)
    (run,) = json.loads(campaign(str(root), "--json", cwd=tmp_path).stdout)["runs"]
    assert (run["epoch"], run["state"]) == (5, "training")
    assert len(run["problems"]) == 1 and "its own CRC does not match" in run["problems"][0]


def test_memory_filesystem_one_listing_per_run_and_no_archive_read(synthetic: Path, monkeypatch, capsys) -> None:
    """Through fsspec (memory://), the view lists each run once (plus the campaign once), reads sidecars and
    histories but no ckpt.tar, and finds the states the local view finds."""
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    from candle_ckpt.cli.main import main

    fs = fsspec.filesystem("memory")
    for path in synthetic.rglob("*"):
        if path.is_file():
            fs.pipe_file(f"/view/{path.relative_to(synthetic).as_posix()}", path.read_bytes())
    listings, reads, local = [], [], threading.local()  # the view reads the runs on several threads

    def counted(method, into):
        def wrapper(self, path, *a, **k):
            local.depth = getattr(local, "depth", 0) + 1
            if local.depth == 1:  # asked for by the view, not a call inside another (find calls ls)
                into.append(path)
            try:
                return method(self, path, *a, **k)
            finally:
                local.depth -= 1

        return wrapper

    for name in ("ls", "find", "glob", "walk"):
        monkeypatch.setattr(MemoryFileSystem, name, counted(getattr(MemoryFileSystem, name), listings))
    for name in ("cat_file", "open", "_open"):
        monkeypatch.setattr(MemoryFileSystem, name, counted(getattr(MemoryFileSystem, name), reads))
    try:
        assert main(["campaign", "memory://view", "--json"]) == 0
        listings, reads = list(listings), list(reads)  # (the clean-up below lists too)
    finally:
        fs.rm("/view", recursive=True)
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert sorted(r["state"] for r in runs) == sorted(STATES)
    assert len(listings) == len(STATES) + 1, sorted(listings)
    assert reads and not [p for p in reads if "ckpt.tar" in p], reads


def test_a_lineage_refusal_in_a_fast_tiers_log_shows_the_run_refused(tmp_path: Path) -> None:
    """A second run that did not resume (ckpt_restart_mode=off) drains into the first one's persistent directory:
    the drain refuses (real engine and drain, ckpt_on_error=warn), and the fast tiers' view says refused."""
    from candle_ckpt.config.params import CkptConfig
    from candle_ckpt.core.log import OpsLog
    from candle_ckpt.engine.capture import Capture
    from candle_ckpt.engine.engine import CheckpointEngine
    from candle_ckpt.storage.store import FileSpec

    def life(fast: Path, **params) -> None:
        cfg = CkptConfig.from_params(
            {"ckpt_directory": str(fast), "ckpt_persistent_url": str(tmp_path / "P"), "epochs": 9, **params}
            | {"ckpt_save_best_metric": "loss"}
        )
        engine = CheckpointEngine(cfg, OpsLog(str(fast / "ckpt.log")))
        for epoch in (1, 2):
            data = bytes(range(epoch, epoch + 200))
            files = [FileSpec("m.bin", lambda f, d=data: f.write(d))]
            engine.save(epoch, {"loss": 1.0 / epoch}, lambda files=files: Capture(files, "m.bin", 200))
        engine.finish()
        engine.close()

    life(tmp_path / "fast" / "run-a")
    life(tmp_path / "fast" / "run-b", ckpt_restart_mode="off", ckpt_on_error="warn")
    out = json.loads(campaign("fast/run-*", "--json", cwd=tmp_path).stdout)
    assert [(r["run"], r["state"]) for r in out["runs"]] == [("run-a", "training"), ("run-b", "refused")]
    assert "of lineage" in out["runs"][1]["why"] and "refusing" not in out["runs"][1]["why"]


def test_a_run_early_stopping_ended_is_done_from_its_sidecar(tmp_path: Path) -> None:
    """model.fit with EarlyStopping ending it at epoch 2 of 10: the sidecar records it (extra "finished") and the
    limit (extra "epochs"), and the campaign view calls the run done, saying why."""
    import keras
    import numpy as np

    from candle_ckpt import CandleCheckpointCallback

    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    params = {"epochs": 10, "ckpt_directory": str(tmp_path / "run-es"), "ckpt_save_best_metric": "loss"}
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=1e9)  # no epoch improves enough
    model.fit(x, x[:, :1], epochs=10, callbacks=[stop, CandleCheckpointCallback(params)], verbose=0)
    side = json.loads((tmp_path / "run-es" / "ckpts" / "epochs" / "002" / "ckpt-info.json").read_text())
    assert (side["extra"]["finished"], side["extra"]["epochs"]) == (["EarlyStopping", 2], 10)
    (run,) = json.loads(campaign(str(tmp_path / "run-es"), "--json", cwd=tmp_path).stdout)["runs"]
    assert (run["state"], run["why"]) == ("done", "a callback ended the run after epoch 2")


def test_s3_one_list_request_per_run_and_no_archive_fetched(synthetic: Path, capsys) -> None:
    """Against a real S3 protocol server (moto, over HTTP through s3fs), the view sends one ListObjectsV2 per run
    and one for the campaign, GETs only sidecars and histories, and finds every state."""
    import socket

    import boto3
    import fsspec
    import s3fs.core
    from moto.server import ThreadedMotoServer

    from candle_ckpt.cli.main import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    region = {"endpoint_url": endpoint, "region_name": "us-east-1"}
    options = {"key": "testing", "secret": "testing", "client_kwargs": region}
    calls: list[tuple[str, str]] = []
    original = s3fs.core.S3FileSystem._call_s3

    async def counted(self, method, *args, **kwargs):
        calls.append((method, kwargs.get("Prefix") or kwargs.get("Key") or ""))
        return await original(self, method, *args, **kwargs)

    try:
        client = boto3.client("s3", **region, aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket="campaign-bucket")
        fsspec.filesystem("s3", **options).put(str(synthetic), "campaign-bucket/c", recursive=True)
        s3fs.core.S3FileSystem._call_s3 = counted
        assert main(["campaign", "s3://campaign-bucket/c", "--json", "--storage-options", json.dumps(options)]) == 0
    finally:
        s3fs.core.S3FileSystem._call_s3 = original
        server.stop()
    out = capsys.readouterr().out
    runs = json.loads(out[out.index("{\n") :])["runs"]  # (moto prints a line when it starts)
    assert sorted(r["state"] for r in runs) == sorted(STATES)
    lists = sorted(key for method, key in calls if method == "list_objects_v2")
    assert lists == ["c/", *(f"c/run-{s}/" for s in sorted(STATES))], lists
    gets = [key for method, key in calls if method == "get_object"]
    assert gets and all(k.endswith(("ckpt-info.json", "restarts.jsonl")) for k in gets), gets
