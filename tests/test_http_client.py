"""Fast unit tests of the HTTP engine client's error wording (no server: ``requests.Session`` calls are faked)."""

from __future__ import annotations

import pytest
import requests

from das_trl.vllm.client import DASEngineError, HTTPDASEngine


class _FakeResponse:
    def __init__(self, status_code: int, text: str):
        self.status_code = status_code
        self.text = text
        self.content = text.encode()

    def json(self):
        import json

        return json.loads(self.text)


# The body vLLM 0.32's dev-mode /collective_rpc returned in CI for a server started without the DAS worker extension.
PLAIN_VLLM_BODY = (
    '{"error":{"message":"Call to collective_rpc method failed: Worker failed with error \'\'CPUWorker\' object has '
    'no attribute \'das_attach\'\', please check the stack trace above for the root cause",'
    '"type":"InternalServerError","param":null,"code":500}}'
)


def _engine(monkeypatch, status: int, body: str) -> HTTPDASEngine:
    monkeypatch.setattr(requests.Session, "post", lambda *a, **k: _FakeResponse(status, body))
    monkeypatch.setattr(requests.Session, "get", lambda *a, **k: _FakeResponse(status, body))
    return HTTPDASEngine("http://127.0.0.1:1")


# The other wording vLLM 0.32 used for the same case in a CI run.
NOT_IMPLEMENTED_BODY = (
    '{"error":{"message":"Call to collective_rpc method failed: Method \'das_attach\' is not implemented.",'
    '"type":"InternalServerError","param":null,"code":500}}'
)


@pytest.mark.parametrize("body", [PLAIN_VLLM_BODY, NOT_IMPLEMENTED_BODY])
def test_worker_without_das_methods_is_reported_as_not_das(monkeypatch, body):
    engine = _engine(monkeypatch, 500, body)
    with pytest.raises(DASEngineError, match="is not a DAS engine.*das-trl serve"):
        engine.stats()


def test_other_server_errors_keep_their_text(monkeypatch):
    engine = _engine(monkeypatch, 500, '{"error":{"message":"out of memory"}}')
    with pytest.raises(DASEngineError, match="HTTP 500.*out of memory"):
        engine.stats()


def test_server_without_dev_mode_is_reported(monkeypatch):
    engine = _engine(monkeypatch, 404, "Not Found")
    with pytest.raises(DASEngineError, match="not started in dev mode"):
        engine.stats()
