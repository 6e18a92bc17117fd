"""How often each kind of quote match occurs on an LLM-style run (issue 25).

    python evals/grounding/match_kinds.py [--limit 60] [--out evals/grounding/match_kinds.json]

Two local OpenAI-compatible servers on 127.0.0.1 stand in for a chat model that judges every claim
against the sentence sharing most of its words and quotes that sentence as evidence: one quotes
it exactly, the other in plain ASCII (curly quotes, dashes, the ellipsis character and odd spaces
written the ASCII way, as chat models often do). The first ``--limit`` RAGTruth QA test samples
are audited through the real litellm backend (rule claims, global stage on), and every evidence
span of every vote and final verdict is counted by its ``match`` (exact, whitespace, folded,
case), with the claims left ungrounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rt4chart.analysis.datasets import load_dataset
from rt4chart.judges.registry import judge_stack
from rt4chart.method.text import content_words
from rt4chart.options import AuditOptions
from rt4chart.runs.engine import Pipeline
from rt4chart.types import AuditRecord

ASCII = str.maketrans({
    "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-", "\u2026": "...",
    "\u00a0": " ", "\u2009": " ", "\u202f": " ",
})
_SENTENCE = re.compile(r"^\[S(\d+)\] (.*)$", re.MULTILINE)
_CLAIM = re.compile(r"^\[(\d+)\] (.*)$", re.MULTILINE)


def judge_reply(body: dict[str, Any], quote: Callable[[str], str]) -> str:
    """Entailed, quoting the sentence in view that shares most content words with the claim."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    context, _, listing = user.rpartition("Claims:\n")
    sentences = [text for _, text in _SENTENCE.findall(context)]
    judgements = []
    for position, (_, claim) in enumerate(_CLAIM.findall(listing)):
        words = set(content_words(claim))
        best = max(sentences, key=lambda s: len(words & set(content_words(s))), default=None)
        if best is None or not words & set(content_words(best)):
            judgements.append({"claim": position, "label": "baseless", "evidence": [], "rationale": "-"})
        else:
            judgements.append({"claim": position, "label": "entailed", "evidence": [quote(best)], "rationale": "-"})
    return json.dumps({"judgements": judgements})


@contextmanager
def serving(quote: Callable[[str], str]) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return None

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            reply = {
                "id": "x", "object": "chat.completion", "created": 0, "model": body.get("model", "m"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": judge_reply(body, quote)}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
            }
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


async def audit(base_url: str, limit: int) -> list[AuditRecord]:
    stack = judge_stack("openai/llm-style", api_base=base_url)
    try:
        pipeline = Pipeline(stack, AuditOptions(decomposer="rules"))
        samples = load_dataset("ragtruth-qa", split="test", limit=limit)
        return [await pipeline.verify_sample(sample) for sample in samples]
    finally:
        await stack.aclose()


def count(reports: list[AuditRecord]) -> dict[str, Any]:
    matches: Counter[str] = Counter()
    for report in reports:
        for claim in report.claims:
            for evidence in [*claim.evidence, *(e for vote in claim.votes for e in vote.evidence)]:
                matches[evidence.match] += 1
    claims = [claim for report in reports for claim in report.claims]
    return {
        "samples": len(reports),
        "claims": len(claims),
        "ungrounded_claims": sum(not claim.grounded for claim in claims),
        "evidence_spans": sum(matches.values()),
        "match": dict(sorted(matches.items())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=60)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("match_kinds.json"))
    arguments = parser.parse_args()
    results: dict[str, Any] = {"dataset": "ragtruth-qa test", "limit": arguments.limit}
    for name, quote in (("quotes_exactly", lambda s: s), ("quotes_in_ascii", lambda s: s.translate(ASCII))):
        with serving(quote) as base_url:
            results[name] = count(asyncio.run(audit(base_url, arguments.limit)))
        print(name, json.dumps(results[name]))
    arguments.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {arguments.out}")


if __name__ == "__main__":
    main()
