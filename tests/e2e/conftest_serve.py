"""Fixtures for the `mxq serve` e2e tests (star-imported by tests/e2e/conftest.py: pytest refuses pytest_plugins
in a conftest below the rootdir, e.g. under `pytest tests`).

- `server`: one session-wide `mxq serve --port 0 --device cpu` on the default model; on teardown it gets SIGTERM
  and must exit 0 within 30 s.
- `serve_factory(*args, env=None, api_key=None, wait=True)`: more servers with other flags, stopped (and their
  exit code checked) when the test ends.
- `client`: the official `openai` client pointed at `server` (no retries, so every answer is the first one).
Server logs: <pytest tmp dir>/serve-logs/*.stderr."""
import subprocess

import pytest

from serve_fixtures import MXQ, Server

__all__ = ["serve_binary", "serve_logs", "server", "serve_factory", "client", "model", "make_client",
           "leave_server_idle", "small_server"]


@pytest.fixture(scope="session")
def serve_binary():
    assert MXQ.exists(), f"{MXQ} missing: run scripts/build first"
    p = subprocess.run([str(MXQ), "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"mxq serve --help exited {p.returncode}: {p.stderr}"
    return MXQ


@pytest.fixture(scope="session")
def serve_logs(tmp_path_factory):
    return tmp_path_factory.mktemp("serve-logs")


@pytest.fixture(scope="session")
def server(serve_binary, serve_logs):
    s = Server(["--port", 0, "--device", "cpu"], serve_logs, name="main")
    yield s
    alive = s.alive()
    rc = s.stop(30)
    assert alive, f"the session server died during the tests:\n{s.log()}"
    assert rc == 0, f"mxq serve exited {rc} after SIGTERM (None = still running after 30 s):\n{s.log()}"


@pytest.fixture
def serve_factory(serve_binary, serve_logs, request):
    started = []

    def start(*args, env=None, api_key=None, wait=True, timeout=120.0, device_cpu=True):
        args = list(args)
        if "--port" not in args:
            args += ["--port", 0]
        if device_cpu and "--device" not in args:
            args += ["--device", "cpu"]
        name = f"{request.node.name}-{len(started)}".replace("/", "_").replace("[", "_").replace("]", "_")
        s = Server(args, serve_logs, env=env, api_key=api_key, wait=wait, timeout=timeout, name=name)
        started.append(s)
        return s

    yield start
    errors = []
    for s in started:
        if s.returncode is not None:
            continue
        rc = s.stop(30)
        if rc != 0:
            errors.append(f"{' '.join(s.args)} exited {rc} after SIGTERM:\n{s.log()}")
    assert not errors, "\n".join(errors)


def make_client(s, api_key=None, timeout=120.0):
    import openai
    return openai.OpenAI(base_url=s.base_url + "/v1", api_key=api_key or s.api_key or "unused", max_retries=0,
                         timeout=timeout)


@pytest.fixture(scope="session")
def client(server):
    return make_client(server)


@pytest.fixture(scope="session")
def model(server):
    return server.model_id


@pytest.fixture
def leave_server_idle(server):
    """A failed test must not leave work behind for the next ones: abort whatever still runs."""
    yield
    try:
        m = server.metrics()
        if (m.value("mxq:num_requests_running") or 0) + (m.value("mxq:num_requests_waiting") or 0) > 0:
            server.post("/abort_request", {"abort_all": True}, timeout=10)
            server.wait_idle(30, kv_zero=False)
    except Exception:  # noqa: BLE001  (the test itself reports what went wrong)
        pass


@pytest.fixture(scope="session")
def small_server(serve_binary, serve_logs):
    """A context of 128 tokens and one sequence at a time: context limits and the waiting queue."""
    s = Server(["--port", 0, "--device", "cpu", "--max-model-len", 128, "--max-num-seqs", 1], serve_logs,
               name="small")
    yield s
    rc = s.stop(30)
    assert rc == 0, f"exit {rc}:\n{s.log()}"
