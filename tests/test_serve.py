"""`bertforge serve`: a real server process on 127.0.0.1 (a free port) answered by real clients.

One server holds a tiny random tagger, classifier and pre-trained (fill-mask) model with MiniLM's vocabulary,
and the real all-MiniLM-L6-v2: the `openai` client's embeddings equal `bertforge embed`'s vectors, every
other route answers what `bertforge predict` / `fill-mask` give, bad requests of each kind get their status
and a message naming the field, 32 concurrent clients lose nothing. A second server, whose batches wait long,
shows the full queue's 429 and SIGTERM answering every request in flight before exiting 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from helpers.documented_commands import FENCED_BLOCK, REPO
from helpers.finetuning import minilm_dir

from bertforge.cli import main
from bertforge.data.labels import LabeledSplit
from bertforge.inference import fill_masks, load_model, read_inputs
from bertforge.models import BertforgeForPreTraining, EncoderConfig, save_bertforge_model
from bertforge.models.classification import BertforgeForSequenceClassification
from bertforge.models.token_classification import BertforgeForTokenClassification
from bertforge.tasks.classify import prediction_rows
from bertforge.tasks.tagging import entity_rows

KEY = "test-token"
TAGGER, CLASSIFIER, EMBEDDER = "supersense-tagging-minilm", "supersense-minilm", "wordnet-embedding-minilm"
AUTH = {"Authorization": f"Bearer {KEY}"}
STARTUP_SECONDS = 300  # loading four models on a loaded 2-core machine
LOAD_SECONDS = float(os.environ.get("BERTFORGE_SERVE_LOAD_SECONDS", "8"))
CLIENTS = 32


def tiny_config() -> EncoderConfig:
    return EncoderConfig(vocab_size=30528, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                         max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0, initializer_range=0.2)


@dataclass
class Server:
    process: subprocess.Popen[str]
    url: str
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def launch(arguments: list[str], log: Path, cwd: Path | None = None, env: dict[str, str] | None = None,
           ) -> tuple[subprocess.Popen[str], Path]:
    """`bertforge serve ... --port 0` as a process, its log lines to `log`."""
    environment = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"} | (env or {})
    with open(log, "w") as errors:
        process = subprocess.Popen([sys.executable, "-m", "bertforge.cli", "serve", *arguments, "--port", "0"],
                                   stdout=subprocess.PIPE, stderr=errors, text=True, env=environment, cwd=cwd)
    return process, log


def ready(launched: tuple[subprocess.Popen[str], Path]) -> Server:
    """The launched server, once it prints its address (after loading its models)."""
    process, log = launched
    assert process.stdout is not None
    deadline = time.monotonic() + STARTUP_SECONDS
    line = ""
    while time.monotonic() < deadline and process.poll() is None:
        line = process.stdout.readline()
        if found := re.search(r"on (http://\S+)", line):
            return Server(process, found[1], log)
    process.kill()
    raise AssertionError(f"the server did not start ({line!r}):\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("served")
    built = {"classifier": BertforgeForSequenceClassification(tiny_config(), 3, "classification", ["neg", "mid", "pos"]),
             "tagger": BertforgeForTokenClassification(tiny_config(), 5, ["O", "B-ACT", "I-ACT", "B-THING", "I-THING"]),
             "mlm": BertforgeForPreTraining(tiny_config())}
    return {name: save_bertforge_model(model.eval(), root / name, minilm_dir()) for name, model in built.items()}


def guide_section() -> str:
    """The guide's section on `bertforge serve`."""
    guide = (REPO / "docs" / "guide.md").read_text(encoding="utf-8")
    start = guide.index("## Serving models over HTTP")
    return guide[start:guide.index("\n## ", start)]


def guide_blocks(language: str) -> list[str]:
    return [block["text"] for block in FENCED_BLOCK.finditer(guide_section()) if block["language"] == language]


@pytest.fixture(scope="module")
def queue_server(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory,
                 ) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A server whose batches wait 3 s, with room for 8 requests: started beside the main one, to load meanwhile."""
    launched = launch([str(models["classifier"]), "--max-queue", "8", "--max-wait-ms", "3000"],
                      tmp_path_factory.mktemp("queue-server") / "serve.log")
    yield launched
    Server(launched[0], "", launched[1]).stop()


@pytest.fixture(scope="module")
def server(models: dict[str, Path], queue_server: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The guide's command as written (but on a free port), in a directory where its three run directories are a
    tiny tagger, a tiny classifier and all-MiniLM-L6-v2, with the key in BERTFORGE_API_KEY; plus a pre-trained
    model for /fill-mask."""
    root = tmp_path_factory.mktemp("server")
    (root / "runs").mkdir()
    for name, target in ((TAGGER, models["tagger"]), (CLASSIFIER, models["classifier"]), (EMBEDDER, minilm_dir())):
        (root / "runs" / name).symlink_to(target, target_is_directory=True)
    [command] = [line for block in guide_blocks("bash") for line in block.splitlines() if line.startswith("bertforge serve")]
    arguments = shlex.split(command)[2:]
    assert arguments == [f"runs/{TAGGER}", f"runs/{CLASSIFIER}", f"runs/{EMBEDDER}", "--port", "8080"]
    running = ready(launch([*arguments[:3], f"mlm={models['mlm']}", *arguments[3:]], root / "serve.log", cwd=root,
                           env={"BERTFORGE_API_KEY": KEY}))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return read_inputs("bundled:supersense/test").texts[:48]


def post(server: Server, route: str, body: object, headers: dict[str, str] = AUTH) -> httpx.Response:
    return httpx.post(server.url + route, json=body, headers=headers, timeout=120)


# ---------------------------------------------------------------------------------------------
# every route against the command that gives the same results


def test_openai_client_embeddings_equal_bertforge_embed(server: Server, texts: list[str], tmp_path: Path) -> None:
    from openai import OpenAI

    source = tmp_path / "texts.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert main(["embed", str(minilm_dir()), "--input", str(source), "--out", str(tmp_path / "v.npy")]) == 0
    expected = np.load(tmp_path / "v.npy")
    client = OpenAI(base_url=server.url + "/v1", api_key=KEY)
    answer = client.embeddings.create(model=EMBEDDER, input=texts)  # the client asks for base64 by default
    assert [item.index for item in answer.data] == list(range(len(texts)))
    assert np.abs(np.array([item.embedding for item in answer.data]) - expected).max() <= 1e-5
    assert answer.usage.prompt_tokens > len(texts) * 3
    one = client.embeddings.create(model=EMBEDDER, input=texts[5], encoding_format="float")
    assert np.abs(np.array(one.data[0].embedding) - expected[5]).max() <= 1e-5
    assert [model.id for model in client.models.list()] == [TAGGER, CLASSIFIER, EMBEDDER, "mlm"]


def test_predict_gives_bertforge_predicts_probabilities(server: Server, models: dict[str, Path],
                                                       texts: list[str]) -> None:
    loaded = load_model(models["classifier"])
    rows = prediction_rows(loaded, LabeledSplit.unlabeled("t", texts[:6])).rows
    answer = post(server, "/predict", {"inputs": texts[:6]})
    assert answer.status_code == 200, answer.text
    for labels, row in zip(answer.json(), rows, strict=True):
        assert labels[0]["label"] == row["label"]
        assert {entry["label"]: entry["score"] for entry in labels} == pytest.approx(row["probabilities"], abs=1e-5)
    single = post(server, "/predict", {"inputs": texts[0], "model": CLASSIFIER}).json()
    assert single[0]["label"] == rows[0]["label"]  # one text: one list, as text-embeddings-inference answers
    pairs = prediction_rows(loaded, LabeledSplit.unlabeled("t", [texts[0]] * 5, texts[1:6])).rows
    mixed = post(server, "/predict", {"inputs": [[texts[0], texts[1]], texts[1]]}).json()
    assert mixed[0][0]["label"] == pairs[0]["label"] and mixed[1][0]["label"] == rows[1]["label"]


def test_rerank_is_served_only_for_a_model_fine_tuned_on_text_pairs(models: dict[str, Path], tmp_path: Path,
                                                                   texts: list[str]) -> None:
    """Two runs of the same classifier, one whose config set finetune.text_pair_column, one without, and the bare
    model directory: only the pair model answers /rerank; the others' /rerank is a 404 saying why (in process)."""
    import shutil

    from fastapi.testclient import TestClient

    from bertforge.config import config_to_yaml, finetune_defaults, load_config
    from bertforge.engine import EngineSettings
    from bertforge.serving.app import ServeSettings, build_app
    from bertforge.serving.served import load_all

    for run, pair_column in (("pairs", ["finetune.text_pair_column=second"]), ("single", [])):
        config = load_config(None, ["finetune.task_type=classification", *pair_column], base=finetune_defaults())
        (tmp_path / run).mkdir()
        (tmp_path / run / "config.yaml").write_text(config_to_yaml(config), encoding="utf-8")
        shutil.copytree(models["classifier"], tmp_path / run / "final")
    served = load_all([str(tmp_path / "pairs"), str(tmp_path / "single"), f"bare={models['classifier']}"],
                      EngineSettings(label="serving"))
    assert {model.name: model.routes for model in served} == {"pairs": ("/predict", "/rerank"),
                                                              "single": ("/predict",), "bare": ("/predict",)}
    loaded = load_model(tmp_path / "pairs")
    pairs = prediction_rows(loaded, LabeledSplit.unlabeled("t", [texts[0]] * 5, texts[1:6])).rows
    expected = [row["probabilities"]["pos"] for row in pairs]  # the last label's probability
    with TestClient(build_app(served, ServeSettings(16384, 0.0, 8, 256, 200_000, None))) as client:
        body = {"query": texts[0], "texts": texts[1:6], "return_text": True}
        ranked = client.post("/rerank", json=body).json()  # the one model that answers it
        assert [entry["index"] for entry in ranked] == sorted(range(5), key=lambda i: -expected[i])
        assert [entry["score"] for entry in ranked] == pytest.approx(sorted(expected, reverse=True), abs=1e-5)
        assert all(entry["text"] == texts[1 + entry["index"]] for entry in ranked)
        for model, why in (("single", "fine-tuned on single texts"), ("bare", "not in a bertforge run directory")):
            refused = client.post("/rerank", json=body | {"model": model})
            assert refused.status_code == 404, refused.text
            message = refused.json()["error"]["message"]
            assert why in message and "/predict" in message and "\n" not in message


def test_tag_gives_entity_spans_with_character_offsets(server: Server, models: dict[str, Path],
                                                       texts: list[str]) -> None:
    expected = [row["entities"] for row in entity_rows(load_model(models["tagger"]), texts[:12]).rows]
    answer = post(server, "/tag", {"inputs": texts[:12]})
    assert answer.status_code == 200, answer.text
    found = answer.json()
    assert sum(map(len, found)) > 0  # random weights still tag something
    for entities, wanted, text in zip(found, expected, texts[:12], strict=True):
        assert [(e["entity_group"], e["start"], e["end"], e["word"]) for e in entities] == [
            (e["entity_group"], e["start"], e["end"], e["word"]) for e in wanted]
        assert [e["score"] for e in entities] == pytest.approx([e["score"] for e in wanted], abs=1e-5)
        assert all(text[e["start"]:e["end"]] == e["word"] for e in entities)
    one = post(server, "/tag", {"inputs": texts[0]}).json()  # one text: its entities
    assert [(e["start"], e["end"]) for e in one] == [(e["start"], e["end"]) for e in found[0]]


def test_fill_mask_gives_the_commands_candidates(server: Server, models: dict[str, Path]) -> None:
    masked = ["the [MASK] of the law", "a [MASK] that flies over the [MASK]"]
    expected = fill_masks(load_model(models["mlm"]), masked, top_k=3)
    answer = post(server, "/fill-mask", {"inputs": masked, "top_k": 3})
    assert answer.status_code == 200, answer.text
    for text, wanted in zip(answer.json(), expected, strict=True):
        assert [[c["token_str"] for c in mask] for mask in text] == [[c.token_str for c in mask] for mask in wanted]
        assert [c["score"] for mask in text for c in mask] == pytest.approx(
            [c.score for mask in wanted for c in mask], abs=1e-5)


# ---------------------------------------------------------------------------------------------
# bad requests


@pytest.mark.parametrize(("route", "body", "headers", "status", "named"), [
    ("/v1/embeddings", {"model": EMBEDDER, "input": "a"}, {}, 401, "Authorization"),
    ("/v1/embeddings", {"model": EMBEDDER, "input": "a"}, {"Authorization": "Bearer wrong"}, 401, "API key"),
    ("/v1/embeddings", b'{"model": EMBEDDER, "input": ', AUTH, 422, "not valid JSON"),
    ("/v1/embeddings", {"input": "a"}, AUTH, 422, "'model' is missing"),
    ("/v1/embeddings", {"model": EMBEDDER, "input": "a", "truncate": True}, AUTH, 422, "'truncate' is not a field"),
    ("/v1/embeddings", {"model": EMBEDDER, "input": {"text": "a"}}, AUTH, 422, "'input'"),
    ("/v1/embeddings", {"model": EMBEDDER, "input": [101, 2023]}, AUTH, 422, "token ids"),
    ("/v1/embeddings", {"model": EMBEDDER, "input": ["a", " "]}, AUTH, 422, "text 1 is empty"),
    ("/v1/embeddings", {"model": EMBEDDER, "input": ["a"] * 257}, AUTH, 413, "--max-texts-per-request"),
    ("/v1/embeddings", {"model": EMBEDDER, "input": ["word " * 50_000]}, AUTH, 413, "--max-chars-per-request"),
    ("/v1/embeddings", {"model": "nope", "input": "a"}, AUTH, 404, "/v1/models lists"),
    ("/v1/embeddings", {"model": TAGGER, "input": "a"}, AUTH, 422, "token_classification model"),
    ("/v1/embeddings", {"model": EMBEDDER, "input": "a", "dimensions": 128}, AUTH, 422, "'dimensions' is 128"),
    ("/tag", {"inputs": "a", "model": CLASSIFIER}, AUTH, 422, "not /tag"),
    ("/rerank", {"query": "a", "texts": ["b"]}, AUTH, 404, "nothing says it was fine-tuned on text pairs"),
    ("/predict", {"inputs": "a", "top_k": 3}, AUTH, 422, "'top_k' is not a field"),
    ("/fill-mask", {"inputs": ["no mask here"]}, AUTH, 422, "no [MASK] token"),
    ("/fill-mask", {"inputs": "the [MASK]", "top_k": 0}, AUTH, 422, "'top_k'"),
])
def test_a_bad_request_gets_its_status_and_a_message_naming_the_field(server: Server, route: str, body: object,
                                                                      headers: dict[str, str], status: int,
                                                                      named: str) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    answer = httpx.post(server.url + route, content=content, timeout=60,
                        headers=headers | {"Content-Type": "application/json"})
    assert answer.status_code == status, answer.text
    message = answer.json()["error"]["message"]
    assert named in message and "\n" not in message
    if status == 401:
        assert answer.headers["WWW-Authenticate"] == "Bearer"


def test_health_needs_no_token_and_metrics_count_requests_and_batches(server: Server) -> None:
    assert "/v1/embeddings" in httpx.get(server.url + "/openapi.json", timeout=30).json()["paths"]  # /docs' source
    health = httpx.get(server.url + "/health", timeout=30)
    assert health.status_code == 200 and health.json()["status"] == "ready"
    assert {m["name"]: m["routes"] for m in health.json()["models"]}[CLASSIFIER] == ["/predict"]  # single texts
    assert httpx.get(server.url + "/metrics", timeout=30).status_code == 401
    assert post(server, "/predict", {"inputs": ["one", "two"]}).status_code == 200
    text = httpx.get(server.url + "/metrics", headers=AUTH, timeout=30).text
    assert re.search(r'bertforge_requests_total\{route="/predict",status="200"\} [1-9]', text)
    assert metric(text, "bertforge_batch_texts_count", CLASSIFIER) >= 1
    assert f'bertforge_queue_depth{{model="{CLASSIFIER}"}} 0.0' in text
    assert "bertforge_request_seconds_bucket" in text


# ---------------------------------------------------------------------------------------------
# load


async def _load(url: str, texts: list[str], seconds: float) -> tuple[list[float], list[tuple[list[int], object]]]:
    """CLIENTS clients each sending requests of 1-3 texts back to back for `seconds`."""
    latencies: list[float] = []
    answers: list[tuple[list[int], object]] = []
    stop = time.monotonic() + seconds

    async def client(http: httpx.AsyncClient, number: int) -> None:
        sent = 0
        while time.monotonic() < stop:
            chosen = [(number * 7 + sent * 3 + k) % len(texts) for k in range(1 + (number + sent) % 3)]
            started = time.perf_counter()
            response = await http.post("/v1/embeddings", json={"model": EMBEDDER, "input": [texts[i] for i in chosen]})
            latencies.append(time.perf_counter() - started)
            answers.append((chosen, response.json() if response.status_code == 200 else response))
            sent += 1

    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)  # a connection per client
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=120, limits=limits) as http:
        await asyncio.gather(*(client(http, number) for number in range(CLIENTS)))
    return latencies, answers


def test_32_concurrent_clients_lose_nothing_and_their_requests_share_batches(server: Server, texts: list[str],
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    reference = np.array([item["embedding"] for item in post(server, "/v1/embeddings",
                                                             {"model": EMBEDDER, "input": texts}).json()["data"]])
    before = _batches(server)
    latencies, answers = asyncio.run(_load(server.url, texts, LOAD_SECONDS))
    failed = [answer for _, answer in answers if not isinstance(answer, dict)]
    assert not failed, f"{len(failed)} of {len(answers)} requests failed, e.g. {failed[0]}"
    for chosen, answer in answers:  # each request got its own texts' vectors, in its order
        got = np.array([item["embedding"] for item in answer["data"]])  # type: ignore[index]
        assert np.abs(got - reference[chosen]).max() <= 1e-4
    runs, merged = (after - was for after, was in zip(_batches(server), before, strict=True))
    texts_sent = sum(len(chosen) for chosen, _ in answers)
    assert merged == texts_sent and runs < len(answers)  # requests shared model runs
    ordered = sorted(latencies)
    with capsys.disabled():
        print(f"\n{CLIENTS} clients, {LOAD_SECONDS:g} s: {len(answers)} requests ({texts_sent} texts), "
              f"{len(answers) / LOAD_SECONDS:.1f} requests/s, p50 {statistics.median(ordered) * 1000:.0f} ms, "
              f"p99 {ordered[int(0.99 * (len(ordered) - 1))] * 1000:.0f} ms, {texts_sent / runs:.1f} texts per model run")


def _batches(server: Server) -> tuple[float, float]:
    """The embedding model's (engine runs, texts run) so far."""
    text = httpx.get(server.url + "/metrics", headers=AUTH, timeout=30).text
    return metric(text, "bertforge_batch_texts_count", EMBEDDER), metric(text, "bertforge_batch_texts_sum", EMBEDDER)


def metric(text: str, name: str, model: str) -> float:
    """A metric's value for one model in Prometheus' text format (0 before its first sample)."""
    found = re.search(rf'^{name}\{{model="{re.escape(model)}"\}} (\S+)$', text, re.M)
    return float(found[1]) if found else 0.0


# ---------------------------------------------------------------------------------------------
# a full queue and SIGTERM


def test_a_full_queue_answers_429_and_sigterm_answers_every_request_in_flight(
        queue_server: tuple[subprocess.Popen[str], Path]) -> None:
    server = ready(queue_server)
    try:
        async def scenario() -> tuple[list[httpx.Response], httpx.Response, list[BaseException]]:
            async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
                in_flight = [asyncio.create_task(http.post("/predict", json={"inputs": [f"text number {i}"]}))
                             for i in range(8)]
                while _queue_depth(server) < 8:  # all eight wait in the batcher (3 s) ...
                    await asyncio.sleep(0.05)
                refused = await http.post("/predict", json={"inputs": "one more"})  # ... so a ninth is refused
                server.process.send_signal(signal.SIGTERM)  # while they wait
                answered = await asyncio.gather(*in_flight)
                await asyncio.sleep(0.5)
                after: list[BaseException] = []
                try:
                    await http.post("/predict", json={"inputs": "after the signal"})
                except httpx.TransportError as error:
                    after.append(error)
                return list(answered), refused, after

        answered, refused, after = asyncio.run(scenario())
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        assert "--max-queue" in refused.json()["error"]["message"]
        assert [response.status_code for response in answered] == [200] * 8
        assert all(response.json()[0][0]["label"] in ("neg", "mid", "pos") for response in answered)
        assert server.process.wait(60) == 0, server.log.read_text()[-3000:]
        assert after, "the server still accepted a request after SIGTERM"
    finally:
        server.stop()


def _queue_depth(server: Server) -> float:
    return metric(httpx.get(server.url + "/metrics").text, "bertforge_queue_depth", "classifier")


def test_the_guides_curl_and_python_examples_run(server: Server, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    address = server.url.removeprefix("http://")
    curls = [line for block in guide_blocks("bash") for line in block.splitlines() if line.startswith("curl ")]
    assert len(curls) >= 5
    environment = os.environ | {"BERTFORGE_API_KEY": KEY}
    for line in curls:
        done = subprocess.run(line.replace("localhost:8080", address), shell=True, capture_output=True, text=True,
                              env=environment, timeout=120)
        assert done.returncode == 0 and done.stdout, f"{line}: {done.stderr}"
        if "/metrics" in line:
            assert "bertforge_requests_total" in done.stdout
        else:
            assert "error" not in json.loads(done.stdout), f"{line}: {done.stdout}"
    [python] = guide_blocks("python")
    monkeypatch.setenv("BERTFORGE_API_KEY", KEY)
    capsys.readouterr()
    exec(compile(python.replace("http://localhost:8080", server.url), "guide.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "2 384" and "'label'" in printed[1] and printed[2].startswith("[")


# ---------------------------------------------------------------------------------------------
# what stops the command before it serves: one line, exit 2


def test_a_bad_model_a_taken_port_or_a_bad_limit_is_one_line_and_exit_2(models: dict[str, Path], tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    from bertforge.tasks.multiple_choice import BertforgeForMultipleChoice

    choice = save_bertforge_model(BertforgeForMultipleChoice(tiny_config()).eval(), tmp_path / "quiz", minilm_dir())
    cases = {"no-such-run": ["serve", str(tmp_path / "no-such-run")],
             "quiz (": ["serve", str(models["classifier"]), str(choice)],  # named, with the routes there are
             "multiple_choice model, which bertforge serve has no route for": ["serve", str(choice)],
             "/tag for token_classification; /v1/embeddings for embedding": ["serve", str(choice)],
             "--max-queue is 0": ["serve", str(models["classifier"]), "--max-queue", "0"],
             "two models are named 'classifier'": ["serve", str(models["classifier"]), str(models["classifier"])],
             "--backend onnx cannot run mlm": ["serve", f"mlm={models['mlm']}", "--backend", "onnx"],
             "--linger is 2.0": ["serve", str(models["classifier"]), "--linger", "2"]}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        cases["cannot listen on 127.0.0.1"] = ["serve", str(models["classifier"]), "--port", str(taken.getsockname()[1])]
        for named, argv in cases.items():
            capsys.readouterr()
            assert main(argv) == 2, argv
            err = capsys.readouterr().err
            assert named in err and "Traceback" not in err, err


def test_a_model_is_named_after_its_run_or_as_given() -> None:
    from bertforge.serving.served import served_name

    assert served_name("runs/supersense-minilm") == ("supersense-minilm", "runs/supersense-minilm")
    assert served_name("runs/tagger/final") == ("tagger", "runs/tagger/final")
    assert served_name("runs/tagger/checkpoints/step-00000250/")[0] == "tagger"
    assert served_name("ner=runs/tagger/final") == ("ner", "runs/tagger/final")
    assert served_name("all-MiniLM-L6-v2") == ("all-MiniLM-L6-v2", "all-MiniLM-L6-v2")


# ---------------------------------------------------------------------------------------------
# the batcher, in process


@pytest.mark.parametrize(("linger", "groups"), [(0.25, [["a"], ["b", "c", "d"]]), (0.0, [["a"], ["b", "c"], ["d"]])])
def test_with_linger_a_group_waits_for_the_clients_the_last_run_answered(linger: float, groups: list[list[str]],
                                                                          ) -> None:
    """Run 1 holds request a while b and c queue; a's client resends (d) as soon as it is answered. With
    --max-wait-ms 0 and no --linger, b and c alone run next (the alternating groups); with --linger the batcher
    waits for the client the last run answered (3 requests were queued or running during it), so b, c and d
    share one run."""
    import threading

    from bertforge.serving.batcher import Batcher
    from bertforge.serving.metrics import server_metrics
    from bertforge.serving.served import EMBEDDINGS, ServedModel

    release = threading.Event()
    ran: list[list[str]] = []

    def run_texts(texts: list[str]) -> list[str]:
        ran.append(list(texts))
        if len(ran) == 1:  # the first run lasts until the test has queued b and c
            release.wait(60)
        return texts

    async def scenario() -> None:
        model = ServedModel("m", "m", "embedding", (EMBEDDINGS,), 4, {"vectors": run_texts})
        batcher = Batcher(model, max_batch_tokens=10**6, max_wait=0.0, max_queue=16, metrics=server_metrics(),
                          linger=linger)
        batcher.start()

        async def closed_loop_client() -> None:
            assert await batcher.submit(("vectors",), ["a"]) == ["a"]
            assert await batcher.submit(("vectors",), ["d"]) == ["d"]  # at once, as a benchmark client does

        first = asyncio.create_task(closed_loop_client())
        while not ran:
            await asyncio.sleep(0.01)
        others = [asyncio.create_task(batcher.submit(("vectors",), [text])) for text in "bc"]
        while batcher.pending < 3:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.4)  # the run's length sets how long the next group may linger (a quarter of it)
        release.set()
        await asyncio.wait_for(asyncio.gather(first, *others), 60)
        await batcher.stop()

    asyncio.run(scenario())
    assert ran == groups


def test_the_onnx_backend_serves_torchs_vectors(models: dict[str, Path], texts: list[str]) -> None:
    """`--backend onnx` (bertforge.backends, as `embed` uses it): a tiny embedding model's served vectors equal the
    torch backend's within 1e-4 (in process; /predict and /tag go through the kind's `predict`, whose onnx
    backend test_backends checks)."""
    from bertforge.engine import EngineSettings
    from bertforge.models.embedding import BertforgeForEmbedding
    from bertforge.serving.served import load_served

    torch.manual_seed(0)
    embedder = save_bertforge_model(BertforgeForEmbedding(replace(tiny_config(), pooling="mean"), normalize=True).eval(),
                                    models["classifier"].parent / "embedder", minilm_dir())
    torch_vectors, onnx_vectors = (load_served(str(embedder), EngineSettings(label="serving", backend=backend))
                                   .run(("vectors",), texts) for backend in ("torch", "onnx"))
    assert np.abs(np.stack([v for v, _ in onnx_vectors]) - np.stack([v for v, _ in torch_vectors])).max() <= 1e-4
    assert [tokens for _, tokens in onnx_vectors] == [tokens for _, tokens in torch_vectors]


def test_hide_progress_keeps_the_engines_bar_out_of_the_servers_log(models: dict[str, Path], texts: list[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`bertforge serve` runs the engine once per group of requests; `console.hide_progress()` (called by serve)
    keeps those runs' progress bars off stderr, which a terminal-like console otherwise shows."""
    import io

    from rich.console import Console

    from bertforge import console, engine
    from bertforge.serving.served import load_served

    served = load_served(str(models["classifier"]), engine.EngineSettings(label="serving requests"))
    monkeypatch.setattr(console, "_verbosity", console.NORMAL)
    monkeypatch.setattr(console, "_progress_hidden", False)  # restored after the test: the flag is process-wide
    shown: list[str] = []
    for hidden in (False, True):
        if hidden:
            console.hide_progress()
        terminal = Console(file=io.StringIO(), force_terminal=True, width=100)
        monkeypatch.setattr(engine, "console", terminal)
        served.run(("rows", False), texts[:4])
        shown.append(terminal.file.getvalue())  # type: ignore[attr-defined]
    assert "serving requests" in shown[0]
    assert shown[1] == "" and not console.progress_enabled()
