"""Shared fixtures: real models (pulled into the cache on first use) and tiny GGUF writers.

The helper modules live in tests/support (on pytest's pythonpath); child Python processes
that tests start get that folder on their PYTHONPATH too, so they import the same helpers.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SUPPORT = Path(__file__).resolve().parent / "support"
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")]))

REAL_MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b")


def real_model_path(name: str) -> Path:
    """Path of a known real model, pulling it on first use (the CI cache keeps it warm)."""
    from edge_infer import hub

    if hasattr(hub, "pull") and not hub.cached_path(name).exists():
        return Path(hub.pull(name, progress=False))
    return hub.resolve_model(name)


_GGUF_PY_READERS: dict[str, object] = {}


def gguf_py_reader(path: Path) -> object:
    """gguf-py's GGUFReader for `path`, opened once per session (it takes 3-15 s per model)."""
    from gguf import GGUFReader

    key = str(path)
    if key not in _GGUF_PY_READERS:
        _GGUF_PY_READERS[key] = GGUFReader(key)
    return _GGUF_PY_READERS[key]


@pytest.fixture(scope="session", params=REAL_MODELS)
def any_real_model(request: pytest.FixtureRequest) -> Path:
    """Each of the three real models in turn."""
    return real_model_path(request.param)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return real_model_path("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return real_model_path("gemma3-270m")


@pytest.fixture(scope="session")
def qwen2_path() -> Path:
    return real_model_path("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def qwen2_1p5b_path() -> Path:
    """The real-size model (1.07 GB Q4_K_M, Q4_K and Q6_K matrices: the K-quant int8 kernel)."""
    return real_model_path("qwen2.5-coder-1.5b")


# Under pytest-xdist (`-n 2`, as .ci/run and the README run it) one test file is one unit of work,
# so a module's server or loaded model is built once, on one worker. The Ray modules form one unit:
# their replica processes are counted machine-wide (cluster_helpers.engine_pids), so two Ray clusters
# must not run at once. Units start heaviest first (HEAVIEST_FIRST, measured on 2 cores), so the last
# to start is a short one and neither worker is left alone at the end with a long file.
RAY_UNIT = "ray-cluster"
HEAVIEST_FIRST = (
    "tests/models/test_forward_agreement.py",
    "tests/formats/test_requantize.py",
    RAY_UNIT,
    "tests/cli/test_quantize.py",
    "tests/models/test_architectures.py",
    "tests/formats/test_quants.py",
    "tests/kernels_cpu/test_attention.py",
    "tests/formats/test_gguf.py",
    "tests/engine/test_spec_real.py",
)


# Handed out after everything else: it waits for the CUDA simulator's process (5-14 minutes of one
# thread), which the controller started before the workers, so both workers run tests beside it.
LAST = ("tests/test_cuda_simulator.py",)


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to under pytest-xdist: its file, or the Ray unit."""
    path = nodeid.split("::")[0]
    return RAY_UNIT if path.startswith("tests/server/test_cluster") else path


def pytest_configure(config: pytest.Config) -> None:
    """With `-n N` (xdist's default `--dist load`): distribute by `work_unit`, in HEAVIEST_FIRST
    order (pytest_xdist_make_scheduler), and run each worker's kernels on one thread (numba's, and
    NumPy's BLAS for the float64 reference). Two workers on two cores each with two OpenMP threads
    convoy: a thread spin-waits at a barrier for a core the other worker holds. The structured-output
    server tests took 12 s alone and 50 s beside a 2-thread engine (18 s with one thread each;
    OMP_WAIT_POLICY=PASSIVE helps there but doubled the suite, whose kernels meet at a barrier per
    operation). Kernels split their work by the n_threads they are given, not by the threads numba
    runs, so batch and thread invariance are still tested. Server processes the tests start
    inherit the setting."""
    if getattr(config.option, "numprocesses", None) and config.option.dist == "load":
        if not os.environ.get("PYTEST_XDIST_WORKER"):
            _start_simulator_beside(config)
        config.option.dist = "edge-infer-units"  # a name no xdist scheduler answers to
        config.option.loadscopereorder = False  # xdist would sort the units by test count
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        os.environ.setdefault("NUMBA_NUM_THREADS", "1")


def _start_simulator_beside(config: pytest.Config) -> None:
    """The xdist controller starts the CUDA simulator's process when the run includes its test
    file and selects by path alone (no -k / -m: the workers' collection could deselect it), and
    tells the workers where it writes (tests/support/simulator_run.py)."""
    import importlib.util

    import simulator_run

    if importlib.util.find_spec("numba_cuda") is None or config.option.keyword or config.option.markexpr:
        return
    target = (config.rootpath / simulator_run.SIM_TESTS).resolve()
    for arg in config.args:
        path = (config.invocation_params.dir / arg.split("::")[0]).resolve()
        if path == target or path in target.parents:
            folder = simulator_run.start()
            os.environ[simulator_run.DIR_ENV] = str(folder)  # the workers start after this, with it
            return


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which the aarch64 job runs without
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """xdist's scope scheduler with `work_unit` as the scope. (Not its `xdist_group` marks: with
    pytest 9.2 their node-id suffix no longer reaches the scheduler, and the groups are ignored.)"""
    if config.option.dist != "edge-infer-units":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return WorkUnitScheduling(config, log)  # type: ignore[arg-type]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, every worker orders the tests by HEAVIEST_FIRST (the scheduler hands out
    units in the order of the collection)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {unit: i for i, unit in enumerate(HEAVIEST_FIRST)}
        rank.update({unit: len(HEAVIEST_FIRST) + 1 + i for i, unit in enumerate(LAST)})
        items.sort(key=lambda item: rank.get(work_unit(item.nodeid), len(HEAVIEST_FIRST)))  # stable within a unit


def _simulator_module(session: pytest.Session) -> object | None:
    """tests/test_cuda_simulator.py as pytest imported it, when its test is selected."""
    for item in session.items:
        if item.nodeid.endswith("test_cuda_kernels_and_engine_under_the_simulator"):
            return getattr(item, "module", None)
    return None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Without xdist, start the CUDA simulator's own process as soon as collection has selected
    its test, so it runs beside the tests before it (tests/test_cuda_simulator.py waits for it).
    Under xdist the controller started it (_start_simulator_beside), or the worker handed the
    test starts it."""
    mod = None if os.environ.get("PYTEST_XDIST_WORKER") else _simulator_module(session)
    if mod is not None:
        mod.start_simulator()  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A session that ends early (-x, Ctrl-C) does not leave the simulator running (the xdist
    controller's session ends after its workers', so it never stops a run they still wait for)."""
    import sys

    run = sys.modules.get("simulator_run")
    if run is not None:
        run.stop()  # type: ignore[attr-defined]
