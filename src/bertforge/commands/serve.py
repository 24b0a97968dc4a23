"""`bertforge serve MODEL [MODEL ...]`: the models behind an HTTP API (bertforge.serving), until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import os

from bertforge.commands.common import add_command

API_KEY_VARIABLE = "BERTFORGE_API_KEY"
DEFAULT_PORT = 8080
DEFAULT_MAX_WAIT_MS = 5.0  # how long a batch waits for more requests (the model's time per batch is far longer)
DEFAULT_MAX_QUEUE = 256  # requests queued or running per model before 429
DEFAULT_MAX_TEXTS = 256  # texts per request (413 beyond)
DEFAULT_MAX_CHARS = 200_000  # characters per request, all texts together (413 beyond)


def register(subparsers: argparse._SubParsersAction) -> None:
    from bertforge.commands.predict import BACKENDS, DEFAULT_BATCH_SIZE, DEFAULT_MAX_BATCH_TOKENS

    parser = add_command(
        subparsers, "serve", help="serve models over HTTP (OpenAI embeddings, predict, tag, fill-mask, rerank)",
        description="Load each MODEL (a run directory, its final/, a checkpoint, all-MiniLM-L6-v2 or any model "
                    "directory; NAME=MODEL names it) and answer HTTP requests until SIGTERM or Ctrl-C: POST "
                    "/v1/embeddings (OpenAI's API) for embedding models, /predict for classifiers and regressors "
                    "(and /rerank for those fine-tuned on text pairs: their run set finetune.text_pair_column), "
                    "/tag for token classifiers, /fill-mask for pre-trained models (a multiple-choice model is "
                    "refused: run it with `bertforge predict`); GET /v1/models, "
                    "/health, /metrics (Prometheus) and /docs (OpenAPI). Concurrent requests to a model are "
                    "gathered for up to --max-wait-ms into one run of the inference engine (length-sorted "
                    "token-budget batches). The address is printed on stdout once the models are loaded. SIGTERM "
                    "stops accepting connections, answers the requests in flight, then exits 0.",
        example="""
        bertforge serve runs/supersense-tagging-minilm runs/supersense-minilm runs/wordnet-embedding-minilm --port 8080
        """)
    parser.add_argument("models", nargs="+", metavar="MODEL", help="run directory, final/, checkpoint, model "
                                                                   "directory or NAME=MODEL")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only; "
                                                            "0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free one)")
    parser.add_argument("--api-key", default=None,
                        help=f"a token every request but /health and /docs must send as 'Authorization: Bearer TOKEN' "
                             f"(default: ${API_KEY_VARIABLE} if set, else none)")
    parser.add_argument("--max-batch-tokens", type=int, default=DEFAULT_MAX_BATCH_TOKENS,
                        help=f"tokens per forward pass, the requests a batch merges included (default "
                             f"{DEFAULT_MAX_BATCH_TOKENS})")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                        help=f"texts per forward pass at most (default {DEFAULT_BATCH_SIZE})")
    parser.add_argument("--backend", choices=BACKENDS, default=BACKENDS[0],
                        help="what runs the models, as in `bertforge predict`: torch (the default), onnx (ONNX Runtime "
                             "on the model's ONNX export, made once and cached under ~/.cache/bertforge/onnx, before "
                             "the server starts) or onnx-int8 (int8 linear layers: faster, slightly less accurate); "
                             "a pre-trained model (/fill-mask) runs on torch only")
    parser.add_argument("--max-wait-ms", type=float, default=DEFAULT_MAX_WAIT_MS,
                        help=f"how long a batch waits for more requests to join it (default {DEFAULT_MAX_WAIT_MS:g})")
    parser.add_argument("--linger", type=float, default=0.0, metavar="SHARE",
                        help="while a batch holds fewer requests than the last model run saw, wait for the rest up to "
                             "SHARE of a model run (e.g. 0.25; default 0: off). Merges the alternating groups that "
                             "clients resending at once fall into, but idles the model for their round trip: measured, "
                             "it helped at 8 clients and hurt at 32 (docs/benchmarks.md, 'Serving embeddings')")
    parser.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE,
                        help=f"requests waiting or running per model; more get 429 with Retry-After (default "
                             f"{DEFAULT_MAX_QUEUE})")
    parser.add_argument("--max-texts-per-request", type=int, default=DEFAULT_MAX_TEXTS,
                        help=f"texts in one request at most, else 413 (default {DEFAULT_MAX_TEXTS})")
    parser.add_argument("--max-chars-per-request", type=int, default=DEFAULT_MAX_CHARS,
                        help=f"characters in one request's texts together at most, else 413 (default {DEFAULT_MAX_CHARS:,})")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertforge.console import hide_progress, log, quiet_transformers, stdout_console
    from bertforge.engine import EngineSettings

    check_serving_installed()
    from bertforge.serving.app import ServeSettings, build_app
    from bertforge.serving.served import load_all
    from bertforge.serving.server import bound_socket, serve_until_stopped

    settings = ServeSettings(args.max_batch_tokens, args.max_wait_ms, args.max_queue, args.max_texts_per_request,
                             args.max_chars_per_request, args.api_key or os.environ.get(API_KEY_VARIABLE) or None,
                             args.linger)
    engine_settings = EngineSettings(max_batch_tokens=args.max_batch_tokens, batch_size=args.batch_size, label="serving",
                                     backend=args.backend)
    quiet_transformers()
    hide_progress()
    models = load_all(args.models, engine_settings)
    for model in models:
        log.info(f"{model.name}: {model.kind} model ({model.reference}): {', '.join(model.routes)}")
    sock = bound_socket(args.host, args.port)  # before the address is printed: a client may connect at once
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    stdout_console.print(f"serving {len(models)} model{'s' * (len(models) != 1)} on http://{shown}:{port}",
                         markup=False, highlight=False)
    stdout_console.file.flush()  # a script waiting for the address reads it now, not when the buffer fills
    serve_until_stopped(build_app(models, settings), sock)
    log.info("stopped: every request in flight was answered")
    return 0


def check_serving_installed() -> None:
    """A one-line error naming the extra when the optional serving packages are missing."""
    import importlib.util

    from bertforge.errors import BertforgeError

    missing = [name for name in ("fastapi", "uvicorn", "prometheus_client") if importlib.util.find_spec(name) is None]
    if missing:
        raise BertforgeError(f"bertforge serve needs {', '.join(missing)}: pip install 'bertforge[serve]'")
