"""The FastAPI app: OpenAI's endpoints over one `Clover`, the chat page, and OpenAI-style errors.

Shapes follow llama-cpp-python's server (`/v1/chat/completions`, `/v1/completions`, `/v1/models`,
streams as server-sent events ending in `data: [DONE]`); every error is an OpenAI error object
(`{"error": {"message", "type", "param", "code"}}`) with a 4xx status for what the client can fix.
A streamed request with `"denoise": true` also gets a `clover.pass` event per decoding pass (the
page draws the block from them); OpenAI clients never ask for it, so never see one.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

import numpy as np
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException

from ..api import Clover, check_token_ids
from ..limits import OptionError
from ..policy import RequestTooLong
from ..rpc import RpcError
from .schemas import ChatCompletionRequest, CompletionRequest, RequestBase, UnsupportedField
from .worker import Job, Message, QueueFull, ShuttingDown, StartFn, Worker

STATIC = resources.files(__package__) / "static"
POLL_SECONDS = 0.05  # how often a waiting handler checks that its client is still there


class APIError(Exception):
    """An error answered as an OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.kind, self.param, self.code = status, kind, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"Retry-After": "1"} if self.status == 429 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def api_error(e: Exception) -> APIError:
    """What a failed request tells its client: the model's refusals are the client's to fix (400)."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, RequestTooLong):
        return APIError(400, str(e), code="context_length_exceeded")
    if isinstance(e, UnsupportedField):
        return APIError(400, str(e), param=e.param, code="unsupported_parameter")
    if isinstance(e, ValueError):
        return APIError(400, str(e))
    if isinstance(e, ShuttingDown | RpcError):  # an RPC server lost: the model is gone until a restart
        return APIError(503, str(e), kind="server_error")
    return APIError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error")


@dataclass
class ServerConfig:
    """What `clover serve` was started with."""

    model_name: str
    api_key: str | None = None
    max_queued: int = 16
    defaults: dict[str, Any] = field(default_factory=dict)  # decoding options of the command line


def create_app(clover: Clover, config: ServerConfig) -> FastAPI:
    """The app serving `clover`; its worker thread lives as long as the app runs (lifespan)."""
    worker = Worker(clover, config.max_queued)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        worker.start()
        yield
        worker.stop()

    app = FastAPI(title="clover serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.worker = worker
    # browser apps on other origins may call it, as llama-cpp-python's and llama.cpp's servers allow
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"])

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, e: APIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, e: HTTPException) -> JSONResponse:
        """Unknown paths (404) and wrong methods (405) as error objects too."""
        return APIError(e.status_code, f"{request.method} {request.url.path}: {e.detail}").response()

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        return invalid_request(e, request.headers.get("content-type")).response()

    async def authorize(request: Request) -> None:
        if config.api_key is None:
            return
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(key.strip(), config.api_key):
            message = "invalid or missing API key (send Authorization: Bearer KEY)"
            raise APIError(401, message, code="invalid_api_key")

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(str(STATIC / "index.html"))

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": config.model_name,
            "mode": clover.mode,
            "modes": list(worker.modes),
            "busy": worker.busy,
            "waiting": worker.waiting,
            "max_queued": config.max_queued,
            "auth": config.api_key is not None,
            **asdict(worker.counters),
        }

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    async def models() -> dict[str, Any]:
        model = {"id": config.model_name, "object": "model", "created": created, "owned_by": "clover-local"}
        return {"object": "list", "data": [{**model, "meta": {"mode": clover.mode}}]}

    @app.post("/v1/completions", dependencies=[Depends(authorize)])
    async def completions(body: CompletionRequest, request: Request) -> Response:
        kwargs = checked(body)
        if isinstance(body.prompt, list):
            try:
                check_token_ids(body.prompt, clover.backend.vocab_size)  # before queuing
            except ValueError as e:
                raise APIError(400, str(e), param="prompt") from e

        def start(on_event):  # runs on the worker thread
            return clover.create_completion(
                body.prompt, stream=body.stream, model=config.model_name, on_event=on_event, **kwargs
            )

        return await respond(request, body, start)

    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)])
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        kwargs = checked(body)
        messages = body.template_messages()

        def start(on_event):  # runs on the worker thread
            return clover.create_chat_completion(
                messages, stream=body.stream, model=config.model_name, on_event=on_event, **kwargs
            )

        return await respond(request, body, start)

    def checked(body: RequestBase) -> dict[str, Any]:
        """The request's `Clover` arguments, once what it asks is known to be servable."""
        try:
            body.check_supported()
        except UnsupportedField as e:
            raise api_error(e) from e
        if body.mode is not None and body.mode not in worker.modes:
            raise APIError(
                400,
                f"mode {body.mode!r} is not available on this server (it runs {', '.join(worker.modes)}; "
                "speculative needs `clover serve --mode speculative`)",
                param="mode",
            )
        return body.clover_kwargs(config.defaults)

    async def respond(request: Request, body: RequestBase, start: StartFn) -> Response:
        job = Job(start, body.mode, body.denoise and body.stream, asyncio.get_running_loop())
        try:
            worker.submit(job)
        except QueueFull as e:
            raise APIError(429, str(e), kind="rate_limit_error", code="queue_full") from e
        first = await next_message(request, job)
        if first is None:  # the client left while the request waited: nobody to answer
            return Response(status_code=499)
        if first.kind == "error":
            raise api_error(first.payload)
        if first.kind == "result":
            return JSONResponse(to_json(first.payload))
        # the stream's own cleanup cancels the job; the background task too, should it never start
        usage = body.stream_options is not None and body.stream_options.include_usage
        events = stream(job, usage)
        return EventSourceResponse(events, ping=15, background=BackgroundTask(job.cancel))

    return app


async def next_message(request: Request, job: Job) -> Message | None:
    """The job's next message, or None (and the job cancelled) once the client disconnects."""
    get = asyncio.ensure_future(job.out.get())
    while True:
        done, _ = await asyncio.wait({get}, timeout=POLL_SECONDS)
        if done:
            return get.result()
        if await request.is_disconnected():
            get.cancel()
            job.cancel()
            return None


async def stream(job: Job, usage_chunk: bool = False) -> AsyncIterator[dict[str, str]]:
    """Server-sent events of a streamed job; closing it (the client left) cancels the job.

    The finishing chunk carries `usage` (as llama-cpp-python's); with `stream_options.include_usage`
    a last chunk with no choices repeats it, as OpenAI sends it."""
    try:
        while True:
            m = await job.out.get()
            if m.kind == "chunk":
                yield {"data": json.dumps(to_json(m.payload))}
                if usage_chunk and "usage" in m.payload:
                    yield {"data": json.dumps({**to_json(m.payload), "choices": []})}
            elif m.kind == "pass":
                yield {"event": "clover.pass", "data": json.dumps(m.payload)}
            elif m.kind == "error":
                yield {"data": json.dumps(api_error(m.payload).body())}
                return
            elif m.kind == "done":
                yield {"data": "[DONE]"}
                return
    finally:
        job.cancel()


def to_json(value: Any) -> Any:
    """A result with plain Python numbers (statistics may hold numpy scalars)."""
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value.item() if isinstance(value, np.generic) else value


def invalid_request(e: RequestValidationError, content_type: str | None = None) -> APIError:
    """The first validation error as one line, with the field it concerns as `param`.

    A body sent as another content type than JSON (`curl -d` sends a form) is not read as JSON:
    the message says so, rather than that the body is no object. A range refusal (`limits`)
    already names its field."""
    first = e.errors()[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return APIError(400, f"malformed JSON in the request body: {first.get('msg')}")
    param = ".".join(loc) or None
    if param is None and content_type and "json" not in content_type.lower():
        return APIError(
            400, f"the request body must be JSON (Content-Type: application/json, not {content_type})"
        )
    error = first.get("ctx", {}).get("error")
    if isinstance(error, OptionError):
        return APIError(400, str(error), param=param)
    return APIError(400, f"{param or 'request body'}: {first.get('msg')}", param=param)


def serve(clover: Clover, config: ServerConfig, host: str, port: int, log_level: str = "info") -> None:
    """Run the server until interrupted (Ctrl-C stops after the running pass)."""
    import uvicorn

    uvicorn.run(create_app(clover, config), host=host, port=port, log_level=log_level)
