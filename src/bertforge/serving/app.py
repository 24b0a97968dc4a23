"""The FastAPI application of `bertforge serve`: routes, request and response shapes, limits, errors.

Shapes: `POST /v1/embeddings` and `GET /v1/models` are OpenAI's (the `openai` client works with `base_url`);
`/predict` and `/rerank` follow text-embeddings-inference's; `/tag` and `/fill-mask` return what
`bertforge predict` / `transformers`' pipelines give per text. A route exists when a served model's task kind
serves it (`TaskKind.serve_routes`, and `pair_routes` for a model fine-tuned on text pairs). FastAPI documents every request body at `/docs` (OpenAPI).

Errors are one JSON object, `{"error": {"message", "type", "param", "code"}}` as OpenAI's API writes them (its
client shows the message): 401 without the bearer token, 404 for an unknown model, 413 over a per-request
limit, 422 for malformed JSON or a wrong field (named in `param` and the message), 429 with `Retry-After`
when the model's queue is full.
"""

from __future__ import annotations

import base64
import hmac
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from bertforge.console import log
from bertforge.errors import BertforgeError, first_line
from bertforge.serving.batcher import Batcher, QueueFull
from bertforge.serving.metrics import ServerMetrics, server_metrics
from bertforge.serving.served import EMBEDDINGS, FILL_MASK, PREDICT, RERANK, TAG, ServedModel

OPEN_PATHS = frozenset({"/health", "/docs", "/docs/oauth2-redirect", "/openapi.json", "/redoc"})  # no token needed


@dataclass(frozen=True)
class ServeSettings:
    """`bertforge serve`'s limits and batching (its flags)."""

    max_batch_tokens: int
    max_wait_ms: float
    max_queue: int  # requests queued or running per model; more are refused with 429
    max_texts_per_request: int  # 413 beyond
    max_chars_per_request: int  # 413 beyond (all of a request's texts together)
    api_key: str | None  # None: no token asked
    linger: float = 0.0  # --linger: how long a group may wait for the last run's clients, as a share of a run

    def __post_init__(self) -> None:
        for flag, value in (("--max-batch-tokens", self.max_batch_tokens), ("--max-queue", self.max_queue),
                            ("--max-texts-per-request", self.max_texts_per_request),
                            ("--max-chars-per-request", self.max_chars_per_request)):
            if value < 1:
                raise BertforgeError(f"{flag} is {value}; give at least 1")
        if not 0 <= self.linger <= 1:
            raise BertforgeError(f"--linger is {self.linger}; give a share of a model run from 0 (off) to 1")
        if self.max_wait_ms < 0:
            raise BertforgeError(f"--max-wait-ms is {self.max_wait_ms}; give 0 or more milliseconds")
        if self.api_key is not None and not self.api_key.strip():
            raise BertforgeError("the API key (--api-key or BERTFORGE_API_KEY) is empty; give a token or leave it unset")


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers


ERROR_TYPES = {401: "authentication_error", 404: "not_found_error", 413: "request_too_large",
               422: "invalid_request_error", 429: "rate_limit_error", 500: "server_error"}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": ERROR_TYPES.get(status, "error"), "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


# ---------------------------------------------------------------------------------------------
# request bodies (extra fields are an error naming them)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


Texts = str | list[str]


class EmbeddingsRequest(Strict):
    """OpenAI's embeddings request; token-id inputs are refused (send the texts)."""

    input: str | list[str] | list[int] | list[list[int]] = Field(description="a text or a list of texts")
    model: str = Field(description="a model id of GET /v1/models")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, description="only the model's own width is accepted")
    user: str | None = None


class PredictRequest(Strict):
    """text-embeddings-inference's: a text, or a list of texts and [text, text_pair] pairs."""

    inputs: str | list[str | tuple[str, str]]
    model: str | None = Field(None, description="needed when several served models answer this route")


class RerankRequest(Strict):
    query: str
    texts: list[str]
    return_text: bool = False
    model: str | None = None


class TagRequest(Strict):
    inputs: Texts
    model: str | None = None


class FillMaskRequest(Strict):
    inputs: Texts = Field(description="texts with one or more [MASK] (or <mask>) tokens")
    top_k: int = Field(5, ge=1, le=100)
    model: str | None = None


# ---------------------------------------------------------------------------------------------
# the application


def build_app(models: list[ServedModel], settings: ServeSettings, metrics: ServerMetrics | None = None) -> FastAPI:
    metrics = metrics or server_metrics()
    batchers = {model.name: Batcher(model, max_batch_tokens=settings.max_batch_tokens,
                                    max_wait=settings.max_wait_ms / 1000, max_queue=settings.max_queue,
                                    metrics=metrics, linger=settings.linger) for model in models}
    started = int(time.time())
    served_routes = {route for model in models for route in model.routes}
    # a route a model withholds (a single-text classifier's /rerank) still exists, to answer 404 with the reason
    offered_routes = served_routes | {route for model in models for route in model.withheld}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for batcher in batchers.values():
            batcher.start()
        yield
        for batcher in batchers.values():  # after uvicorn has answered every request in flight
            await batcher.stop()

    app = FastAPI(title="bertforge serve", lifespan=lifespan,
                  description="bertforge models behind OpenAI's embeddings API and text-embeddings-inference's "
                              "shapes. Errors: {\"error\": {\"message\", \"type\", \"param\", \"code\"}}.")
    known_paths = {"/health", "/metrics", "/v1/models", *offered_routes}

    @app.middleware("http")
    async def authorize_and_count(request: Request, call_next: Any) -> Response:
        arrived = time.perf_counter()
        path = request.url.path
        if settings.api_key is not None and path not in OPEN_PATHS and not _authorized(request, settings.api_key):
            response: Response = error_response(401, "missing or wrong API key: send the header "
                                                "'Authorization: Bearer <key>'", headers={"WWW-Authenticate": "Bearer"})
        else:
            response = await call_next(request)
        route = path if path in known_paths else "other"
        metrics.requests.labels(route, str(response.status_code)).inc()
        metrics.latency.labels(route).observe(time.perf_counter() - arrived)
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(error.errors())
        return error_response(422, message, param)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return error_response(error.status, error.message, error.param, error.code, error.headers)

    def batcher_for(route: str, requested: str | None) -> Batcher:
        answering = [batcher for batcher in batchers.values() if route in batcher.model.routes]
        if requested is None:
            if len(answering) == 1:
                return answering[0]
            if not answering:  # only models that withhold the route
                raise ApiError(404, " ".join(b.model.withheld[route] for b in batchers.values()
                                             if route in b.model.withheld), "model")
            raise ApiError(422, f"several models answer {route} ({', '.join(b.model.name for b in answering)}); "
                                "name one in the field 'model'", "model")
        if requested not in batchers:
            raise ApiError(404, f"model {requested!r} is not served here; GET /v1/models lists "
                                f"{', '.join(batchers)}", "model", "model_not_found")
        batcher = batchers[requested]
        if route in batcher.model.withheld:
            raise ApiError(404, batcher.model.withheld[route], "model")
        if route not in batcher.model.routes:
            raise ApiError(422, f"model {requested!r} is a {batcher.model.kind} model: it answers "
                                f"{', '.join(batcher.model.routes)}, not {route}", "model")
        return batcher

    def check_limits(texts: list[str], field: str) -> None:
        if not texts:
            raise ApiError(422, f"'{field}' is empty; give at least one text", field)
        if len(texts) > settings.max_texts_per_request:
            raise ApiError(413, f"{len(texts)} texts in one request; at most {settings.max_texts_per_request} "
                                "(--max-texts-per-request): split them over several requests", field)
        characters = sum(len(text) for text in texts)
        if characters > settings.max_chars_per_request:
            raise ApiError(413, f"{characters:,} characters in one request; at most {settings.max_chars_per_request:,}"
                                " (--max-chars-per-request): split them over several requests", field)
        for index, text in enumerate(texts):
            if not text.strip():
                raise ApiError(422, f"'{field}' text {index} is empty; give each text some words", field)

    async def run(batcher: Batcher, work: tuple[Any, ...], inputs: list[Any]) -> list[Any]:
        try:
            return await batcher.submit(work, inputs)
        except QueueFull as full:
            raise ApiError(429, f"model {batcher.model.name!r} has {batcher.max_queue} requests waiting (--max-queue); "
                                f"retry after {full.retry_after} s", code="queue_full",
                           headers={"Retry-After": str(full.retry_after)}) from None
        except BertforgeError as error:
            raise ApiError(422, first_line(error)) from None
        except Exception as error:
            log.error(f"{batcher.model.name}: {type(error).__name__}: {first_line(error)}")
            raise ApiError(500, f"internal error: {type(error).__name__}: {first_line(error)}") from None

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Ready: the models are loaded (the server binds its port only after loading them)."""
        return {"status": "ready", "models": [{"name": m.name, "kind": m.kind, "routes": list(m.routes)}
                                              for m in models]}

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": m.name, "object": "model", "created": started,
                                            "owned_by": "bertforge", "kind": m.kind, "routes": list(m.routes)}
                                           for m in models]}

    if EMBEDDINGS in served_routes:
        @app.post(EMBEDDINGS)
        async def embeddings(body: EmbeddingsRequest) -> JSONResponse:
            batcher = batcher_for(EMBEDDINGS, body.model)
            texts = [body.input] if isinstance(body.input, str) else body.input
            if any(not isinstance(text, str) for text in texts):
                raise ApiError(422, "'input' holds token ids; send the texts themselves", "input")
            if body.dimensions is not None and body.dimensions != batcher.model.hidden_size:
                raise ApiError(422, f"'dimensions' is {body.dimensions}; {body.model} gives "
                                    f"{batcher.model.hidden_size} (leave it out)", "dimensions")
            check_limits(texts, "input")  # type: ignore[arg-type]
            results = await run(batcher, ("vectors",), texts)
            data = [{"object": "embedding", "index": index,
                     "embedding": (base64.b64encode(vector.astype("<f4").tobytes()).decode()
                                   if body.encoding_format == "base64" else vector.tolist())}
                    for index, (vector, _) in enumerate(results)]
            tokens = sum(count for _, count in results)
            return JSONResponse({"object": "list", "data": data, "model": body.model,
                                 "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    if PREDICT in served_routes:
        @app.post(PREDICT)
        async def predict(body: PredictRequest) -> JSONResponse:
            """Every label with its probability, best first (a regression model: its score as LABEL_0)."""
            batcher = batcher_for(PREDICT, body.model)
            inputs = [body.inputs] if isinstance(body.inputs, str) else body.inputs
            check_limits([text for item in inputs for text in ([item] if isinstance(item, str) else item)], "inputs")
            singles = [index for index, item in enumerate(inputs) if isinstance(item, str)]
            pairs = [index for index, item in enumerate(inputs) if not isinstance(item, str)]
            answers: list[Any] = [None] * len(inputs)
            for indices, is_pair in ((singles, False), (pairs, True)):
                if indices:
                    rows = await run(batcher, ("rows", is_pair), [inputs[i] for i in indices])
                    for index, row in zip(indices, rows, strict=True):
                        answers[index] = _labels_of(row)
            return JSONResponse(answers[0] if isinstance(body.inputs, str) else answers)

    if RERANK in offered_routes:
        @app.post(RERANK)
        async def rerank(body: RerankRequest) -> JSONResponse:
            """Each text scored as a pair with the query (a regression model's score, else the probability of the
            model's last label), best first."""
            batcher = batcher_for(RERANK, body.model)
            check_limits(body.texts, "texts")
            if not body.query.strip():
                raise ApiError(422, "'query' is empty; give it some words", "query")
            rows = await run(batcher, ("rows", True), [(body.query, text) for text in body.texts])
            ranked = sorted(({"index": index, "score": _pair_score(row)} | ({"text": body.texts[index]}
                                                                            if body.return_text else {})
                             for index, row in enumerate(rows)), key=lambda entry: -entry["score"])
            return JSONResponse(ranked)

    if TAG in served_routes:
        @app.post(TAG)
        async def tag(body: TagRequest) -> JSONResponse:
            """Each text's entities: {entity_group, score, word, start, end}, start and end being character
            offsets into the text (as `bertforge predict` and transformers' token-classification pipeline)."""
            batcher = batcher_for(TAG, body.model)
            texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
            check_limits(texts, "inputs")
            rows = await run(batcher, ("rows", False), texts)
            entities = [row["entities"] for row in rows]
            return JSONResponse(entities[0] if isinstance(body.inputs, str) else entities)

    if FILL_MASK in served_routes:
        @app.post(FILL_MASK)
        async def fill_mask(body: FillMaskRequest) -> JSONResponse:
            """For each text, for each mask left to right, the top_k candidates {score, token, token_str,
            sequence}."""
            from dataclasses import asdict

            batcher = batcher_for(FILL_MASK, body.model)
            texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
            check_limits(texts, "inputs")
            filled = await run(batcher, ("masks", body.top_k), texts)
            answers = [[[asdict(candidate) for candidate in mask] for mask in text] for text in filled]
            return JSONResponse(answers[0] if isinstance(body.inputs, str) else answers)

    return app


def _authorized(request: Request, api_key: str) -> bool:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


def _labels_of(row: dict[str, Any]) -> list[dict[str, Any]]:
    if "probabilities" not in row:  # regression
        return [{"label": "LABEL_0", "score": row["score"]}]
    return sorted(({"label": label, "score": score} for label, score in row["probabilities"].items()),
                  key=lambda entry: -entry["score"])


def _pair_score(row: dict[str, Any]) -> float:
    if "probabilities" not in row:
        return float(row["score"])
    return float(list(row["probabilities"].values())[-1])


def _validation_message(errors: Any) -> tuple[str, str | None]:
    """One line naming the field (OpenAI's `param`) from pydantic's errors."""
    errors = list(errors)
    first = errors[0]
    location = [str(part) for part in first["loc"][1:]]  # after "body"
    if first["type"] == "json_invalid":
        return f"the request body is not valid JSON ({first['msg']}): send one JSON object", None
    if not location:
        return f"the request body: {first['msg']}; send one JSON object with the route's fields", None
    field = location[0]
    if first["type"] == "extra_forbidden":
        return f"'{field}' is not a field of this request; remove it (GET /docs lists the fields)", field
    if first["type"] == "missing":
        return f"'{field}' is missing; add it (GET /docs lists the fields)", field
    # deeper parts are list positions, or the union member pydantic tried ("str", "list[str]"): shown as [i] only
    shown = field + "".join(f"[{part}]" for part in location[1:] if part.isdigit())
    return f"'{shown}': {first['msg']}", field
