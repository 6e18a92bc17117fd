"""A small HTTP server that answers vLLM's completions protocol with ``prompt_logprobs``.

llama.cpp's server returns no prompt log-probabilities, so the server path of the signals layer
is tested against this one: a real HTTP server on 127.0.0.1 (stdlib ``ThreadingHTTPServer``) that
computes each prompt's log-probabilities with the transformers model, one un-batched forward
pass per prompt and a full log-softmax over the vocabulary, and answers in vLLM's response shape:
per choice, ``prompt_logprobs`` = ``[null, {"<token id>": {"logprob", "rank", "decoded_token"}, ...}]``
holding the prompt's own token plus the ``prompt_logprobs`` most likely others.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from rt4chart.signals.transformers_backend import TransformersBackend

SERVED_MODEL = "smollm2-test"


def prompt_logprobs(backend: TransformersBackend, ids: list[int], top: int) -> tuple[list[Any], int]:
    """vLLM's ``prompt_logprobs`` list for one prompt, and the greedy next token."""
    with torch.inference_mode():
        logits = backend.model(input_ids=torch.tensor([ids], device=backend.device)).logits[0].float()
        log_probs = torch.log_softmax(logits, dim=-1)
    entries: list[Any] = [None]
    for position in range(1, len(ids)):
        row = log_probs[position - 1]
        token = ids[position]
        value = float(row[token])
        entry = {str(token): {"logprob": value, "rank": int((row > value).sum()) + 1, "decoded_token": ""}}
        if top > 0:
            best = torch.topk(row, top)
            for rank, (other, other_value) in enumerate(zip(best.indices.tolist(), best.values.tolist(), strict=True)):
                entry.setdefault(str(other), {"logprob": other_value, "rank": rank + 1, "decoded_token": ""})
        entries.append(entry)
    return entries, int(log_probs[-1].argmax())


class PromptLogprobsServer:
    """Serves ``backend`` at ``api_base`` until :meth:`stop`."""

    def __init__(self, backend: TransformersBackend) -> None:
        self.backend = backend
        self.requests = 0
        lock = threading.Lock()  # one forward pass at a time: the model is shared with the test
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": SERVED_MODEL, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                if self.path != "/v1/completions":
                    self._send(404, {"error": {"message": "not found"}})
                    return
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompts = request["prompt"]
                if prompts and isinstance(prompts[0], int):
                    prompts = [prompts]
                top = request.get("prompt_logprobs")
                choices = []
                with lock:
                    outer.requests += 1
                    for index, ids in enumerate(prompts):
                        entries, next_token = prompt_logprobs(outer.backend, ids, top or 0)
                        choices.append(
                            {
                                "index": index,
                                "text": outer.backend.tokenizer.hf.decode([next_token]),
                                "logprobs": None,
                                "finish_reason": "length",
                                "stop_reason": None,
                                "prompt_logprobs": entries if top is not None else None,
                            }
                        )
                tokens = sum(len(ids) for ids in prompts)
                usage = {"prompt_tokens": tokens, "completion_tokens": len(prompts)}
                self._send(
                    200,
                    {
                        "id": f"cmpl-{outer.requests}",
                        "object": "text_completion",
                        "created": int(time.time()),
                        "model": SERVED_MODEL,
                        "choices": choices,
                        "usage": {**usage, "total_tokens": tokens + len(prompts)},
                    },
                )

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.api_base = f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
