"""`bertforge serve`: the models of run directories behind an HTTP API (FastAPI on uvicorn).

- `served.py`    loads each MODEL and says which routes it serves (its task kind's record names them) and what
                 runs a route's merged inputs through the inference engine (`bertforge.engine`);
- `batcher.py`   one dynamic batcher per model: concurrent requests gathered into token-budget groups, the model
                 run on a worker thread, a bounded queue;
- `app.py`       the FastAPI application: request and response shapes (OpenAI's /v1/embeddings,
                 text-embeddings-inference's /predict and /rerank), limits, the bearer token, errors;
- `metrics.py`   the Prometheus metrics of /metrics.
"""
