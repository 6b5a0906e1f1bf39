"""`clover serve` as a real process on 127.0.0.1: the official `openai` client (stream and not)
against the same model run in-process, the denoise events, auth, OpenAI-style errors, client
disconnects, a bounded load test, and the chat page in headless Chromium."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest


def need(module: str, hint: str) -> Any:
    """Import a module the tests need: skipped without it on a developer's machine, failed in CI
    (which installs everything, so a missing install step shows)."""
    try:
        return __import__(module)
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"needs {module}: {hint}", allow_module_level=True)


need("fastapi", "pip install 'clover-local[server]'")
openai = need("openai", "pip install 'clover-local[dev]'")

from clover_local.api import Clover  # noqa: E402

pytestmark = pytest.mark.llama

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# the think ramp forces `</think>` after a few tokens, so answers have reasoning and content
RAMPS = {"think_ramp_start": 0.0, "think_ramp_max": 60.0, "presence_penalty": 0.4, "repeat_penalty": 1.2}
THINKING = {**RAMPS, "thinking": True}
KEY = "sk-test-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `clover serve` process on a free port of 127.0.0.1, stopped with Ctrl-C (SIGINT)."""

    def __init__(self, model: Path, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        clover_bin = Path(sys.executable).with_name("clover")
        cmd = [str(clover_bin), "serve", str(model), "--port", str(self.port), "--alias", "tiny", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"clover serve exited {self.proc.returncode}: {self.proc.stdout.read()}")
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("clover serve did not answer /health within 60 s")

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request(
                method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})}
            )
            resp = conn.getresponse()
            data = resp.read()
            is_json = (resp.getheader("content-type") or "").startswith("application/json")
            return resp.status, json.loads(data) if is_json else data.decode()
        finally:
            conn.close()

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        return self.request("GET", path, **kw)

    def post(self, path: str, payload: Any, **kw: Any) -> tuple[int, Any]:
        return self.request("POST", path, json.dumps(payload).encode(), **kw)

    def health(self) -> dict[str, Any]:
        return self.get("/health")[1]

    def wait_idle(self, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            h = self.health()
            if not h["busy"] and h["waiting"] == 0:
                return h
            time.sleep(0.05)
        raise AssertionError(f"server still busy after {timeout} s: {self.health()}")

    def client(self, key: str = "none") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def start(llama_gguf: Path) -> Iterator[Callable[..., Server]]:
    """`start(*args)`: a server on the tiny GGUF, stopped (and checked to exit 0) after the module."""
    servers: list[Server] = []

    def make(*args: str) -> Server:
        servers.append(Server(llama_gguf, *args))
        return servers[-1]

    yield make
    for s in servers:
        assert s.stop() == 0, s.proc.stdout.read()


@pytest.fixture(scope="module")
def server(start) -> Server:
    return start()


@pytest.fixture(scope="module")
def local(llama_gguf: Path) -> Iterator[Clover]:
    """The same model in this process: what the server must answer, token for token."""
    with Clover(llama_gguf, n_ctx=8192) as clover:
        yield clover


def sse_events(server: Server, payload: dict[str, Any]) -> list[tuple[str, str]]:
    """A streamed request read to its end as (event, data) pairs."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", "/v1/chat/completions", json.dumps(payload), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("content-type").startswith("text/event-stream")
    events, name = [], "message"
    for raw in resp:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            events.append((name, line[5:].strip()))
            name = "message"
    conn.close()
    return events


# -- the OpenAI API ---------------------------------------------------------------------------------


def test_models_and_health(server: Server) -> None:
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["tiny"]
    h = server.health()
    assert h["status"] == "ok" and h["mode"] == "diffusion" and h["modes"] == ["diffusion", "ar"]


def test_chat_matches_the_model_in_process(server: Server, local: Clover) -> None:
    """The openai client's answer, not streamed, is the in-process `Clover` answer exactly."""
    got = server.client().chat.completions.create(
        model="tiny", messages=QUESTION, max_tokens=48, extra_body=THINKING
    )
    want = local.create_chat_completion(QUESTION, max_tokens=48, **THINKING)
    msg, want_msg = got.choices[0].message, want["choices"][0]["message"]
    assert msg.content == want_msg["content"] and msg.content
    assert msg.model_extra["reasoning_content"] == want_msg["reasoning_content"]
    assert got.choices[0].finish_reason == want["choices"][0]["finish_reason"]
    assert got.usage.prompt_tokens == want["usage"]["prompt_tokens"]
    assert got.usage.completion_tokens == want["usage"]["completion_tokens"]
    assert got.model == "tiny" and got.object == "chat.completion"
    assert got.model_extra["clover"]["tokens"] == want["clover"]["tokens"]


def test_chat_stream_matches_the_whole_answer(server: Server) -> None:
    client = server.client()
    whole = client.chat.completions.create(
        model="tiny", messages=QUESTION, max_tokens=48, extra_body=THINKING
    )
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=QUESTION, max_tokens=48, stream=True, extra_body=THINKING
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks)
    assert content == whole.choices[0].message.content
    assert reasoning == whole.choices[0].message.model_extra["reasoning_content"]
    assert [c.choices[0].finish_reason for c in chunks][-1] == whole.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    with_usage = client.chat.completions.create(
        model="tiny", messages=QUESTION, max_tokens=8, stream=True, stream_options={"include_usage": True}
    )
    last = list(with_usage)[-1]  # OpenAI's usage chunk: no choices
    assert last.choices == [] and last.usage.total_tokens == last.usage.prompt_tokens + 8


def test_completions_stream_and_not(server: Server, local: Clover) -> None:
    client = server.client()
    got = client.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=40)
    want = local.create_completion("The quick brown fox", max_tokens=40)
    assert got.choices[0].text == want["choices"][0]["text"] and got.object == "text_completion"
    stream = client.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=40, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == got.choices[0].text
    assert chunks[-1].choices[0].finish_reason == got.choices[0].finish_reason


def test_clover_settings_are_request_fields(server: Server, local: Clover) -> None:
    """mode, threshold and block size reach the decoder: an AR answer and a lower threshold's
    fewer passes, each equal to the in-process run with the same settings."""
    client = server.client()
    fast = client.chat.completions.create(
        model="tiny", messages=QUESTION, max_tokens=32, extra_body={"threshold": 0.0}
    ).model_extra["clover"]
    slow = client.chat.completions.create(
        model="tiny", messages=QUESTION, max_tokens=32, extra_body={"threshold": 1.0}
    ).model_extra["clover"]
    assert fast["passes"] < slow["passes"]
    assert (
        fast["tokens"]
        == local.create_chat_completion(QUESTION, max_tokens=32, threshold=0.0)["clover"]["tokens"]
    )
    ar = client.chat.completions.create(
        model="tiny", messages=QUESTION, max_tokens=12, extra_body={"mode": "ar"}
    ).model_extra["clover"]
    assert ar["mode"] == "ar" and ar["passes"] == len(ar["tokens"])
    assert server.health()["mode"] == "diffusion"  # a request's mode does not stick
    newer = client.chat.completions.create(model="tiny", messages=QUESTION, max_completion_tokens=5)
    assert newer.usage.completion_tokens == 5 and newer.choices[0].finish_reason == "length"


def test_denoise_events_show_every_pass(server: Server) -> None:
    """With `denoise`, a `clover.pass` event per preview: masks only ever fill within a block, and
    the passes counted match the decoding statistics."""
    events = sse_events(server, {"messages": QUESTION, "max_tokens": 64, "stream": True, "denoise": True})
    assert events[-1] == ("message", "[DONE]")
    passes = [json.loads(d) for e, d in events if e == "clover.pass" and json.loads(d)["type"] == "pass"]
    commits = [json.loads(d) for e, d in events if e == "clover.pass" and json.loads(d)["type"] == "commit"]
    stats = json.loads(events[-2][1])["clover"]
    assert len(passes) == stats["passes"] and len(commits) == stats["blocks"] == 2
    for before, after in zip(passes, passes[1:], strict=False):
        if before["block"] == after["block"]:
            for i in after["filled"]:
                assert before["tokens"][i] is None and after["tokens"][i] is not None
            masked = [t is None for t in after["tokens"]]
            assert sum(masked) == sum(t is None for t in before["tokens"]) - len(after["filled"])
    # without the flag (any OpenAI client) no event but the chunks
    plain = sse_events(server, {"messages": QUESTION, "max_tokens": 16, "stream": True})
    assert {e for e, _ in plain} == {"message"}


# -- auth, errors ---------------------------------------------------------------------------------------


def test_api_key(start) -> None:
    server = start("--api-key", KEY)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        status, body = server.get("/v1/models", headers=headers)
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
    status, body = server.post("/v1/chat/completions", {"messages": QUESTION}, headers={})
    assert status == 401
    with pytest.raises(openai.AuthenticationError):
        server.client("wrong").chat.completions.create(model="tiny", messages=QUESTION, max_tokens=4)
    answer = server.client(KEY).chat.completions.create(model="tiny", messages=QUESTION, max_tokens=4)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert server.get("/health")[0] == 200 and server.get("/")[0] == 200  # no key for the page


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (b'{"messages": [{"role": "user", "content": "hi"}', None, None),  # malformed JSON
        (b"[1, 2]", None, None),
        ({"messages": "hello"}, "messages", None),
        ({"messages": QUESTION, "max_tokens": "many"}, "max_tokens", None),
        ({"messages": QUESTION, "max_tokens": 0}, "max_tokens", None),
        ({"messages": QUESTION, "threshold": 2}, "threshold", None),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role", None),
        ({"messages": QUESTION, "n": 2}, "n", "unsupported_parameter"),
        ({"messages": QUESTION, "tools": [{"type": "function"}]}, "tools", "unsupported_parameter"),
        ({"messages": QUESTION, "mode": "speculative"}, "mode", None),
        ({"messages": QUESTION, "max_tokens": 10**6}, None, "context_length_exceeded"),
        ({"messages": [{"role": "user", "content": "clover " * 9000}]}, None, "context_length_exceeded"),
    ],
)
def test_bad_requests_get_openai_errors(
    server: Server, body: Any, param: str | None, code: str | None
) -> None:
    """Each a 400 with an OpenAI error object; the server answers the next request as usual."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, reply = server.request("POST", "/v1/chat/completions", raw)
    assert status == 400, reply
    error = reply["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param and error["code"] == code
    assert server.post("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 4})[0] == 200


def test_error_messages_say_what_to_fix(server: Server) -> None:
    """A range refusal reads as the API's (no validator wording); a body sent as a form (`curl -d`
    without a JSON content type) is told to be JSON."""
    status, reply = server.post("/v1/chat/completions", {"messages": QUESTION, "coreset_top_p": 0})
    assert status == 400 and reply["error"]["param"] == "coreset_top_p"
    assert reply["error"]["message"] == "coreset_top_p must be a number > 0 and <= 1, got 0.0"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    body = json.dumps({"messages": QUESTION}).encode()
    status, reply = server.request("POST", "/v1/chat/completions", body, headers=form)
    assert status == 400
    assert reply["error"]["message"] == (
        "the request body must be JSON (Content-Type: application/json, "
        "not application/x-www-form-urlencoded)"
    )


@pytest.mark.parametrize("field", [{"logit_bias": {"9": -100}}, {"grammar": 'root ::= "a"'}])
def test_features_the_model_cannot_give_are_refused_by_name(server: Server, field: dict[str, Any]) -> None:
    """llama-cpp-python's request fields that would change the answer in a way Clover cannot are
    refused as the API refuses them, not silently ignored."""
    status, reply = server.post("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 4, **field})
    assert status == 400, reply
    assert (reply["error"]["param"], reply["error"]["code"]) == (next(iter(field)), "unsupported_parameter")


def test_openai_client_raises_on_errors(server: Server) -> None:
    with pytest.raises(openai.BadRequestError, match="request too long"):
        server.client().completions.create(model="tiny", prompt="clover " * 9000, max_tokens=8)
    with pytest.raises(openai.NotFoundError):
        server.client().embeddings.create(model="tiny", input="hi")
    with pytest.raises(openai.BadRequestError, match="token ids"):
        server.client().completions.create(model="tiny", prompt=[1, 2, 10**6], max_tokens=8)
    with pytest.raises(openai.BadRequestError, match="empty"):
        server.client().completions.create(model="tiny", prompt="", max_tokens=8)
    status, body = server.get("/v1/chat/completions")
    assert status == 405 and "Method Not Allowed" in body["error"]["message"]


# -- serving behaviour --------------------------------------------------------------------------------


def test_disconnect_stops_the_generation(server: Server) -> None:
    """A client that leaves mid-stream (or mid-wait) ends its generation: counted as cancelled,
    the server idle long before the full answer would have taken, and still answering."""
    before = server.wait_idle()
    long = {"messages": QUESTION, "max_tokens": 4096, "stop_ramp_max": 0.0, "stream": True, "denoise": True}
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", json.dumps(long), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    for line in resp:  # until the first pass has run
        if line.startswith(b"event: clover.pass"):
            break
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    after = server.wait_idle(timeout=10)
    assert after["cancelled"] == before["cancelled"] + 1 and after["completed"] == before["completed"]
    # not streamed: the client times out while the model decodes
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=0.5)
    with pytest.raises(TimeoutError):
        conn.request(
            "POST",
            "/v1/chat/completions",
            json.dumps({**long, "stream": False}),
            {"Content-Type": "application/json"},
        )
        conn.getresponse()
    conn.close()
    after = server.wait_idle(timeout=10)
    assert after["cancelled"] == before["cancelled"] + 2 and after["completed"] == before["completed"]
    assert server.post("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 4})[0] == 200


def test_load_every_request_answered_or_refused(start) -> None:
    """64 requests from 8 clients on a queue of 3: each gets an answer or a 429 error object,
    nothing is lost, the counters add up, and the server is healthy after."""
    server = start("--max-queued", "3")

    def client(i: int) -> list[tuple[int, Any]]:
        results = []
        for j in range(8):
            body = {"messages": [{"role": "user", "content": f"question {i}.{j}"}], "max_tokens": 8}
            results.append(server.post("/v1/chat/completions", body))
        return results

    with ThreadPoolExecutor(8) as pool:
        results = [r for rs in pool.map(client, range(8)) for r in rs]
    assert len(results) == 64
    answered = [b for s, b in results if s == 200]
    refused = [b for s, b in results if s == 429]
    assert len(answered) + len(refused) == 64
    assert all(b["choices"][0]["finish_reason"] in ("stop", "length") for b in answered)
    assert all(b["error"]["type"] == "rate_limit_error" for b in refused)
    assert len(answered) >= 8 and refused  # 8 clients, 4 places: some are turned away
    h = server.wait_idle()
    assert (h["completed"], h["rejected"], h["failed"]) == (len(answered), len(refused), 0)
    assert server.post("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 4})[0] == 200


def test_serve_help_lists_the_shared_options() -> None:
    clover_bin = Path(sys.executable).with_name("clover")
    out = subprocess.run(
        [clover_bin, "serve", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        check=True,
    ).stdout
    for flag in (
        "--host",
        "--port",
        "--api-key",
        "--max-queued",
        "--mode",
        "--n-gpu-layers",
        "--threshold",
        "--coreset",
        "--think-ramp-max",
        "--max-tokens",
    ):
        assert flag in out


def test_serve_refuses_an_address_it_cannot_listen_on(llama_gguf: Path) -> None:
    """A port out of range is a usage error, a port in use one line, both before the model loads."""
    clover_bin = str(Path(sys.executable).with_name("clover"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args, code, line in (
            (["--port", "70000"], 2, "error: --port must be an integer from 1 to 65535, got 70000"),
            (["--port", str(port)], 1, f"error: cannot listen on 127.0.0.1:{port}: Address already in use"),
        ):
            res = subprocess.run(
                [clover_bin, "serve", str(llama_gguf), *args], capture_output=True, text=True, timeout=60
            )
            assert (res.returncode, res.stderr.strip()) == (code, line)


def test_follow_up_turn_reuses_the_conversation(server: Server) -> None:
    """The next turn of a conversation runs only its new tokens: the `Clover` API keeps the
    sequence between requests, and the server sends every request through the same one."""
    client = server.client()
    first = [{"role": "user", "content": "Tell me about clover. " * 20}]
    a = client.chat.completions.create(model="tiny", messages=first, max_tokens=16)
    follow = [*first, a.choices[0].message.model_dump(), {"role": "user", "content": "Why?"}]
    b = client.chat.completions.create(model="tiny", messages=follow, max_tokens=16)
    stats = b.model_extra["clover"]
    assert stats["prompt_cache"] != "none"
    # kept: the first turn's history (up to its generation prompt), not run again
    assert 0.9 * a.usage.prompt_tokens < stats["prompt_kept_tokens"] < b.usage.prompt_tokens


# -- the page --------------------------------------------------------------------------------------------

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,800",
)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """Debian's Chromium under its chromedriver (no browser download), a fresh profile."""
    need("selenium", "pip install 'clover-local[dev]'")
    from selenium import webdriver

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing: .ci/run installs it with `make browser`")
        pytest.skip("needs Debian's chromium and chromium-driver (make browser)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    session = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))
    yield session
    session.quit()


def test_page_streams_and_shows_the_blocks_denoise(start, browser: Any, tmp_path: Path) -> None:
    """The page at /: masked cells in the block view while it decodes, the answer streamed with its
    thinking apart, and every decoding pass drawn (the count the page drew equals the passes the
    server ran). The think ramp comes from the command line: `clover serve`'s decoding options are
    every request's defaults."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    ramps = [f"--{k.replace('_', '-')}={v}" for k, v in RAMPS.items()]
    server = start(*ramps)
    browser.get(server.url + "/")
    wait = WebDriverWait(browser, 60, poll_frequency=0.02)
    wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
    assert "tiny" in browser.find_element(By.ID, "model").text
    browser.find_element(By.ID, "threshold").send_keys("1")  # a position per pass: a slow fill to watch
    browser.find_element(By.ID, "max-tokens").send_keys("96")
    browser.find_element(By.ID, "prompt").send_keys("What is a clover?\n")
    streaming = "#log .msg.assistant[data-state=streaming]"
    wait.until(  # in the second block (the first one's text above), masked cells on show
        lambda b: (
            b.find_elements(By.CSS_SELECTOR, streaming)
            and int(b.find_element(By.TAG_NAME, "body").get_attribute("data-passes") or 0) > 40
            and b.find_elements(By.CSS_SELECTOR, "#block .cell.masked")
        )
    )
    shot = Path(os.environ.get("CLOVER_SCREENSHOT", tmp_path / "page.png"))
    assert browser.save_screenshot(str(shot))
    done = "#log .msg.assistant[data-state=done]"
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, done))
    msg = browser.find_element(By.CSS_SELECTOR, done)
    thinking = msg.find_element(By.CSS_SELECTOR, ".thinking .text").get_attribute("textContent")
    content = msg.find_element(By.CSS_SELECTOR, ".content").get_attribute("textContent")
    assert thinking and content and msg.find_element(By.CSS_SELECTOR, ".thinking").is_displayed()
    stats = msg.find_element(By.CSS_SELECTOR, ".stats")
    drawn = browser.find_element(By.TAG_NAME, "body").get_attribute("data-passes")
    assert int(drawn) == int(stats.get_attribute("data-passes")) > 0
    assert len(browser.find_elements(By.CSS_SELECTOR, "#block .cell")) == 32  # the last block
    assert "tokens/pass" in stats.text
    # a second turn: the conversation so far goes with it (more prompt tokens than the first)
    browser.find_element(By.ID, "prompt").send_keys("Why?\n")
    wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, done)) == 2)
    first, second = (
        m.find_element(By.CSS_SELECTOR, ".stats").text for m in browser.find_elements(By.CSS_SELECTOR, done)
    )
    prompt_tokens = [int(s.split("prompt ")[1].split()[0]) for s in (first, second)]
    assert prompt_tokens[1] > prompt_tokens[0] + 10
    # Stop: the page drops the request, and the server stops decoding it
    before = server.wait_idle()["cancelled"]
    max_tokens = browser.find_element(By.ID, "max-tokens")
    max_tokens.clear()
    max_tokens.send_keys("2048")
    browser.find_element(By.ID, "prompt").send_keys("Go on.\n")
    wait.until(
        lambda b: (
            b.find_elements(By.CSS_SELECTOR, streaming) and b.find_elements(By.CSS_SELECTOR, ".cell.new")
        )
    )
    browser.find_element(By.ID, "stop").click()
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#log .msg.assistant[data-state=stopped]"))
    assert server.wait_idle(timeout=10)["cancelled"] == before + 1
