"""The libraries' output goes to <run_dir>/libraries.log; the console keeps errors, tracebacks and a known warning's
meaning, once. Through real loggers (vLLM's, Ray's) and Ray's own driver-side dispatcher of worker lines."""
import io
import logging

import pytest

from reasonrl.logging import library_output
from reasonrl.logging.library_output import LIBRARY_LOG, install, uninstall

TOKEN_WARNING = ("Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out. For "
                 "more information, see https://docs.ray.io/en/latest/ray-security/token-auth.html")


@pytest.fixture
def routed(tmp_path):
    console = io.StringIO()
    out = install(str(tmp_path), verbose=False, console=console)
    yield out, console, tmp_path / LIBRARY_LOG
    uninstall()


def test_library_loggers_go_to_the_file_and_errors_stay_on_the_console(routed):
    out, console, path = routed
    vllm = logging.getLogger("vllm.model_executor.model_loader")
    vllm.setLevel(logging.INFO)
    vllm.info("Loading weights took 0.12 seconds")
    vllm.warning("ParallelLMHead: Failed to load weights")
    vllm.error("engine core died")
    text = path.read_text()
    assert "Loading weights took 0.12 seconds" in text and "ParallelLMHead" in text and "engine core died" in text
    assert "Loading weights" not in console.getvalue() and "ParallelLMHead" not in console.getvalue()
    assert "engine core died" in console.getvalue()


def test_a_known_warning_is_explained_once(routed):
    out, console, path = routed
    ray_auth = logging.getLogger("ray._private.authentication.authentication_token_setup")
    ray_auth.warning(TOKEN_WARNING)
    ray_auth.warning(TOKEN_WARNING)
    lines = console.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("reasonrl: note: Ray: ") and "auth_token" in lines[0], lines
    assert path.read_text().count("Token authentication is enabled") == 2


def test_ray_worker_lines_keep_only_the_traceback_on_the_console(routed):
    out, console, path = routed
    lines = ["INFO 12-04 20:27:30 [loader.py:12] Loading weights took 0.12 seconds",
             "Traceback (most recent call last):", '  File "worker.py", line 3, in generate',
             "    raise ValueError('x')",
             "ValueError: x", "INFO 12-04 20:27:31 [core.py:9] shutting down"]
    out.worker_lines({"lines": lines, "pid": 4242, "actor_name": "ActorRolloutRefWorker", "is_err": True})
    prefix = "(ActorRolloutRefWorker pid=4242) "
    assert console.getvalue().splitlines() == [prefix + line for line in lines[1:5]]
    assert path.read_text().splitlines() == [prefix + line for line in lines]

    status = ["======== Autoscaler status: 2026-12-04 20:35:02 ========", "Node status",
              ":event_summary:Adding 1 node(s) of type head"]
    out.worker_lines({"lines": status, "pid": "autoscaler", "is_err": False})
    assert path.read_text().splitlines()[len(lines):] == ["(worker pid=autoscaler) :event_summary:Adding 1 node(s) of "
                                                          "type head"]  # the periodic status is left out


def test_verbose_leaves_the_libraries_alone_and_uninstall_puts_everything_back(tmp_path):
    import sys

    vllm = logging.getLogger("vllm")
    own = logging.StreamHandler(sys.stdout)  # as vLLM configures its logger: a handler printing to stdout
    kept = logging.NullHandler()  # not a console handler: it stays on, and the console one goes back before it
    vllm.handlers.insert(0, own)
    vllm.addHandler(kept)
    try:
        before = (list(vllm.handlers), vllm.propagate)
        assert install(str(tmp_path), verbose=True) is None and not (tmp_path / LIBRARY_LOG).exists()
        install(str(tmp_path), verbose=False)
        assert own not in vllm.handlers and library_output._active.handler in vllm.handlers and not vllm.propagate
        uninstall()
        assert (list(vllm.handlers), vllm.propagate) == before
    finally:
        vllm.removeHandler(own)
        vllm.removeHandler(kept)


@pytest.mark.slow
def test_a_real_ray_workers_output_goes_to_the_file(tmp_path):
    """Ray started as the trainer starts it: its token warning explained once on the console, a worker's vLLM-style
    info line in the file only, the worker's traceback on the console too."""
    import ray

    from reasonrl.controller import start_ray

    console = io.StringIO()
    out = install(str(tmp_path), verbose=False, console=console)
    try:
        start_ray(None, num_cpus=1)
        library_output.after_ray_start()

        @ray.remote
        def worker():
            import sys
            import traceback

            print("INFO 12-04 20:27:30 [loader.py:12] Loading weights took 0.12 seconds", flush=True)
            try:
                raise ValueError("worker went wrong")
            except ValueError:
                traceback.print_exc()
            print("done marker", file=sys.stderr, flush=True)

        ray.get(worker.remote())
        path = tmp_path / LIBRARY_LOG
        seen = wait_until(lambda: "done marker" in path.read_text())
        assert seen, path.read_text()
    finally:
        ray.shutdown()
        uninstall()
    text, shown = path.read_text(), console.getvalue()
    assert "Loading weights took 0.12 seconds" in text and "Loading weights" not in shown
    assert "ValueError: worker went wrong" in shown and "Traceback (most recent call last):" in shown
    assert "done marker" not in shown
    if "Token authentication is" in text:  # what Ray says depends on RAY_AUTH_MODE and ~/.ray
        assert shown.count("reasonrl: note: Ray:") == 1 and "Token authentication" not in shown


def wait_until(condition, timeout_s: float = 60.0) -> bool:
    """Wait until ``condition()`` holds: Ray's log monitor delivers the worker's lines on its own thread."""
    import threading
    import time

    tick = threading.Event()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        tick.wait(0.2)
    return False


def test_the_tied_heads_reload_warning_is_dropped_only_for_tied_embeddings(model_path):
    from reasonrl.models.loader import ties_word_embeddings
    from reasonrl.rollout.vllm_engine import _ReloadNoiseFilter

    def record(layer):
        return logging.LogRecord("vllm.model_executor.model_loader.reload.layerwise", logging.WARNING, "layerwise.py",
                                 266, "%s: Failed to load weights", (layer,), None)

    assert ties_word_embeddings(model_path)  # the real SmolLM2 ties lm_head to embed_tokens
    tied, untied = _ReloadNoiseFilter(tied_head=True), _ReloadNoiseFilter(tied_head=False)
    assert not tied.filter(record("ParallelLMHead")) and untied.filter(record("ParallelLMHead"))
    assert not untied.filter(record("RotaryEmbedding")) and tied.filter(record("QKVParallelLinear"))
