"""Models that ``fit`` trains through their own ``train_step`` (``jobs/custom_step.py``): what a restore does
with a GAN's optimizers, which Keras builds only at their first ``apply_gradients`` (in this process, on
TensorFlow), the GAN killed and resumed on torch, and keras.io's JAX guide's model killed and resumed on JAX.
And inputs on a backend other than their own, killed and resumed: a torch ``DataLoader`` feeding ``fit`` on
TensorFlow and JAX (``jobs/torch_loader.py``), tf.data on JAX and torch (jobs of ``exact_job.py``, forked by
its server under a backend of their own).

The kill and signal tests of these models on TensorFlow are in ``test_exact_resume.py`` and
``test_preemption.py``.
"""

from __future__ import annotations

import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import signal  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jobserver import JobServer  # noqa: E402

from candle_ckpt import CandleCheckpointCallback, restart  # noqa: E402
from candle_ckpt.core.errors import ModelMismatch  # noqa: E402


def _gan():
    import custom_step  # noqa: PLC0415 (imports TensorFlow)

    model = custom_step.build("gan")
    custom_step.compile_model(model)
    return model


@pytest.fixture
def trained(tmp_path):
    """A GAN trained 2 epochs with the callback (the best by its summed loss), and its parameters."""
    import keras  # noqa: PLC0415

    keras.utils.set_random_seed(1)
    gp = {"epochs": 2, "ckpt_directory": str(tmp_path / "gan"), "ckpt_save_best_metric": "loss"}
    model = _gan()
    x = np.random.default_rng(0).standard_normal((64, 8)).astype("float32")
    model.fit(x, batch_size=16, epochs=2, verbose=0, callbacks=[CandleCheckpointCallback(gp, logger=None)])
    return model, gp


@pytest.mark.tf_only  # the GAN's step in this process: tf.GradientTape
def test_a_gans_optimizers_get_their_saved_state_when_keras_builds_them(trained):
    """restart() into a fresh GAN leaves its two optimizers unbuilt (and model.optimizer, unused when saved,
    too); when each is built, with the variables its train_step applies it to, it holds the saved state."""
    model, gp = trained
    fresh = _gan()
    assert restart(gp, fresh, logger=None)["epoch"] == 2
    assert not (fresh.d_optimizer.built or fresh.g_optimizer.built or fresh.optimizer.built)
    fresh.d_optimizer.build(fresh.discriminator.trainable_variables)
    fresh.g_optimizer.build(fresh.generator.trainable_variables)
    for name in ("d_optimizer", "g_optimizer"):
        saved, loaded = getattr(model, name).variables, getattr(fresh, name).variables
        assert len(saved) == len(loaded) > 2, name
        assert all(np.asarray(a).tobytes() == np.asarray(b).tobytes() for a, b in zip(saved, loaded, strict=True))
    assert "build" not in vars(fresh.d_optimizer), "the instance's build was not given back"


@pytest.mark.tf_only
def test_a_gan_optimizer_built_on_other_variables_is_refused_at_its_build(trained):
    """The saved state of d_optimizer does not fit it when it is built on the generator's variables: its build
    raises ModelMismatch naming it and what to do, and its variables keep their fresh values."""
    _, gp = trained
    fresh = _gan()
    restart(gp, fresh, logger=None)
    with pytest.raises(ModelMismatch, match=r"the state of d_optimizer restored from .* does not fit") as err:
        fresh.d_optimizer.build(fresh.generator.trainable_variables)
    assert "Apply d_optimizer to the variables it was applied to" in str(err.value)
    assert int(np.asarray(fresh.d_optimizer.iterations)) == 0


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """``servers(backend)``: one ``exact_job.py`` job server per backend for the module, started when first asked.
    Each job is a fork of a process that imported Keras, its backend and candle_ckpt once: a fresh process per
    run spent about 5 s importing them, most of this module's time (three runs per test)."""
    started: dict[str, JobServer] = {}

    def get(backend: str) -> JobServer:
        if backend not in started:
            stderr = tmp_path_factory.mktemp(f"server-{backend}") / "server.stderr"
            started[backend] = JobServer("exact_job.py", stderr, env={"KERAS_BACKEND": backend})
        return started[backend]

    yield get
    for server in started.values():
        server.close()


def _once(servers, backend: str, setup: str, phase: str, directory, out, expect: int, *more: str) -> list[str]:
    """One job of ``exact_job.py`` (SETUP PHASE DIR OUT [steps]) under ``backend``, forked by its server; its exit
    status (negative: the signal that ended it) checked, its lines returned."""
    server = servers(backend)
    lines, status = server.run(setup, phase, str(directory), str(out), *more)
    code = os.waitstatus_to_exitcode(status)
    assert code == expect, f"exit {code}: {lines}\n{server.stderr_path.read_text()[-3000:]}"
    return lines


def _killed_and_resumed(servers, backend: str, setup: str, tmp_path, every_step: bool = False) -> tuple[list[str], int]:
    """``setup`` under ``backend``, run uninterrupted, then killed with SIGKILL after step 2 of epoch 3 and resumed:
    from epoch 1 or 2 (epoch 2's write may be in flight at the kill), or, ``every_step``, from the step
    checkpoint of step 1 of epoch 3 (one after every step, written at once). Returns the names of the arrays that
    differ between the two runs' ends, and how many optimizer variables were compared."""
    more = ("steps",) if every_step else ()
    _once(servers, backend, setup, "full", tmp_path / "full", tmp_path / "full.npz", 0, *more)
    _once(servers, backend, setup, "kill", tmp_path / "job", tmp_path / "killed.npz", -signal.SIGKILL, *more)
    said = _once(servers, backend, setup, "resume", tmp_path / "job", tmp_path / "resumed.npz", 0, *more)
    log = (tmp_path / "job" / "ckpt.log").read_text()
    if every_step:
        assert said[0] == "start 2", said
        assert re.search(r"resumed from \S+/steps/\d+ \(epoch 3, step 1,", log), log
    else:
        assert said[0] in ("start 1", "start 2"), said
    with np.load(tmp_path / "full.npz") as a, np.load(tmp_path / "resumed.npz") as b:
        assert a.files == b.files
        return [k for k in a.files if a[k].tobytes() != b[k].tobytes()], sum(k.startswith("opt") for k in a.files)


@pytest.mark.needs_package("torch")
def test_a_gan_on_torch_killed_mid_epoch_resumes_bit_identical(tmp_path, servers):
    """The GAN with torch's train_step (backward, then each optimizer's apply, eagerly: no traced build), killed
    with SIGKILL mid-epoch 3 and resumed: its weights and both optimizers end as in the uninterrupted run."""
    differ, slots = _killed_and_resumed(servers, "torch", "gan", tmp_path)
    assert slots > 20 and differ == []  # two Adams' slots


@pytest.mark.needs_package("jax")
def test_a_stateless_jax_train_step_killed_mid_epoch_resumes_bit_identical(tmp_path, servers):
    """keras.io's JAX guide's model (train_step(state, data) returning the new state, which Keras's JAX fit keeps
    outside the variables until the epoch ends), with Dropout, a metric and validation data, killed with SIGKILL
    after step 2 of epoch 3 and resumed from the step checkpoint of its step 1: its weights and Adam's variables
    end as in the uninterrupted run."""
    differ, slots = _killed_and_resumed(servers, "jax", "jax_step", tmp_path, every_step=True)
    assert slots >= 10 and differ == []  # Adam: iterations, learning rate, two moments of four weights


@pytest.mark.needs_package("torch", "jax")
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_a_torch_dataloader_on_another_backend_killed_mid_epoch_resumes_bit_identical(backend, tmp_path, servers):
    """A torch DataLoader (shuffle=True; torch seeded by the job, as Keras seeds it on the torch backend only)
    feeding fit on TensorFlow or JAX draws each epoch's order from torch's global generator: killed after step 2
    of epoch 3 and resumed from step 1's checkpoint, the run ends as the uninterrupted one (it did not while
    torch's generator was saved on the torch backend only: every weight differed)."""
    differ, slots = _killed_and_resumed(servers, backend, "torch_loader", tmp_path, every_step=True)
    log = (tmp_path / "job" / "ckpt.log").read_text()
    assert re.search(r"restored input \(TorchDataLoaderAdapter\), .*rng:torch_cpu@epoch-begin", log), log
    assert slots >= 10 and differ == []


@pytest.mark.needs_package("jax", "torch", "grain")
@pytest.mark.parametrize(
    ("backend", "setup", "every_step"),
    [("jax", "grain_map", True), ("jax", "grain_repeat", False), ("jax", "grain_repeat", True),
     ("torch", "grain_repeat", True)],
)  # fmt: skip
def test_a_grain_dataset_killed_mid_epoch_resumes_bit_identical(backend, setup, every_step, tmp_path, servers):
    """A grain MapDataset feeding fit on JAX (Keras's GrainDatasetAdapter): one seeded shuffle, read afresh each
    epoch, resumed from a step checkpoint; and the same reshuffled each epoch by ``repeat()`` with steps_per_epoch,
    whose one iterator Keras keeps across epochs, resumed from an epoch's checkpoint and from a step checkpoint;
    the last on torch too (fit reads grain through a torch DataLoader there). The kept iterator is made again and
    read to the saved step. Before, the second started its iterator afresh (every weight differed) and every
    grain input was warned of as one whose position cannot be saved."""
    differ, slots = _killed_and_resumed(servers, backend, setup, tmp_path, every_step)
    log = (tmp_path / "job" / "ckpt.log").read_text()
    assert "not one whose position candle_ckpt can save" not in log, log  # the warning every grain input had
    if setup == "grain_repeat":
        assert re.search(r"restored input \(grain, \d+ batches read again in [\d.]+ s\)", log), log
    assert slots >= 10 and differ == []


@pytest.mark.needs_package("jax", "torch")
@pytest.mark.parametrize(
    ("backend", "setup", "every_step"),
    [("jax", "tfdata_reshuffle", False), ("jax", "tfdata_repeat", False), ("torch", "tfdata_reshuffle", True)],
)
def test_tf_data_on_jax_and_torch_killed_mid_epoch_resumes_bit_identical(backend, setup, every_step, tmp_path, servers):
    """tf.data on JAX and torch, whose fit makes each epoch's TensorFlow iterator only when it first reads it (and
    makes one it never reads at each epoch's end): a reshuffling dataset resumed from an epoch's checkpoint and
    from a step checkpoint, and a ``.repeat()`` one with steps_per_epoch, whose kept iterator cannot be saved
    there and is read again to its place. Before, the first drew one reshuffle too many (the iterators Keras made
    were counted, not those it read) and the second started from the dataset's beginning: every weight differed."""
    differ, slots = _killed_and_resumed(servers, backend, setup, tmp_path, every_step)
    log = (tmp_path / "job" / "ckpt.log").read_text()
    if setup == "tfdata_repeat":
        assert re.search(r"restored input \(tf\.data, \d+ batches read again in [\d.]+ s\)", log), log
        assert "cannot be saved" not in log, log
    assert slots >= 10 and differ == []


@pytest.mark.needs_package("jax", "torch")
@pytest.mark.parametrize(("backend", "every_step"), [("jax", False), ("jax", True), ("torch", True)])
def test_a_pydataset_with_worker_threads_killed_mid_epoch_resumes_bit_identical(backend, every_step, tmp_path, servers):
    """A PyDataset shuffled in place, read by two worker threads (``workers=2``), on JAX and torch: their ``fit``
    reads one batch before training (to build the model), so from then on each epoch takes first the batches the
    workers fetched ahead in the epoch before. Killed after step 2 of epoch 3 and resumed from an epoch's and from
    a step checkpoint, the run ends as the uninterrupted one: the checkpoint keeps those queued batches. Before,
    the resumed epoch took the batches of its own first read instead, and every weight differed."""
    differ, slots = _killed_and_resumed(servers, backend, "pydataset_workers", tmp_path, every_step)
    assert slots >= 10 and differ == []
    log = (tmp_path / "job" / "ckpt.log").read_text()
    queued = re.findall(r"restored input \(pydataset, (\d+) queued batches\)", log)
    assert queued and int(queued[0]) > 0, log


@pytest.mark.needs_package("jax", "torch")
@pytest.mark.parametrize(
    ("backend", "setup", "every_step"),
    [("jax", "pydataset_endless_workers", True), ("torch", "pydataset_endless", False)],
)
def test_an_endless_pydataset_resumes_bit_identical(backend, setup, every_step, tmp_path, servers):
    """An infinite PyDataset (``num_batches`` None, ``steps_per_epoch`` 3) whose batch ``i`` depends on ``i``: Keras
    numbers its batches on across epochs, so a resumed run must ask for the index the saved run would have asked
    next. Read by two worker threads on JAX (their counter and the two batches queued at the epoch's beginning,
    resumed from a step checkpoint), and by fit's own iterator on torch (resumed from an epoch's), killed after step
    2 of epoch 3 and resumed, the run ends as the uninterrupted one. Before, the resumed run asked for batch 0
    again and every weight differed, with no warning. Also the tripwire of ``fit_internals.endless_index``,
    ``start_endless_at`` and, on Keras 3.13 (.ci/run), ``prefetched``: its JAX fit keeps one batch taken ahead
    from the enqueuer, which the checkpoint keeps too."""
    differ, slots = _killed_and_resumed(servers, backend, setup, tmp_path, every_step)
    assert slots >= 10 and differ == []


def test_a_pydataset_read_by_forked_processes_ends_and_resumes_bit_identical(tmp_path, servers):
    """A PyDataset with get_state/set_state read by two processes (``use_multiprocessing=True``), whose pools Keras
    forks mid-fit and ends with SIGTERM: the job ends (uninterrupted, killed, resumed) and the resumed run ends as
    the uninterrupted one. Before, a forked worker kept candle_ckpt's SIGTERM handler, ignored the SIGTERM, and the
    job hung at its exit waiting for it (3 runs of 6)."""
    differ, slots = _killed_and_resumed(servers, "tensorflow", "pydataset_processes", tmp_path)
    assert slots >= 10 and differ == []


@pytest.mark.needs_package("jax")
def test_queued_batches_that_cannot_be_kept_are_said_once_and_saving_goes_on(tmp_path, servers):
    """When the batches a PyDataset's workers fetched ahead cannot be kept (here: over a cap lowered to 1 byte),
    one warning says so and what to do, and every epoch is still checkpointed."""
    _once(servers, "jax", "pydataset_workers_over_cap", "full", tmp_path / "job", tmp_path / "full.npz", 0)
    log = (tmp_path / "job" / "ckpt.log").read_text()
    said = re.findall(r"PyDataset's workers fetched ahead .* are not saved \(they pass 0 MiB\).*workers=1", log)
    assert len(said) == 1, log
    assert sorted(p.name for p in (tmp_path / "job" / "ckpts" / "epochs").iterdir())[-1] == "005", log
