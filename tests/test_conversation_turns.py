"""Every assistant turn of a conversation audited: ``rt4 convert conversations`` writes one line per turn
(``rt4 verify`` keeps one record per input line), each turn audited on the messages before it. The
hand-made agent conversation of tests/test_conversations.py, a scripted judge, the real CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fixtures.reports.runs import rt4
from test_conversations import CONVERSATION, RULES

EXIT_USAGE = 2


def convert(directory: Path, *lines: dict[str, Any]) -> tuple[int, str, list[dict[str, Any]]]:
    chats, turns = directory / "chats.jsonl", directory / "turns.jsonl"
    chats.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    done = rt4("convert", "conversations", "--path", str(chats), "--out", str(turns), cwd=directory)
    assert "Traceback" not in done.stderr
    written = [json.loads(line) for line in turns.read_text(encoding="utf-8").splitlines()] if turns.exists() else []
    return done.returncode, done.stderr, written


def test_each_assistant_turn_becomes_a_line_audited_on_what_came_before_it(tmp_path: Path) -> None:
    untitled = {key: value for key, value in CONVERSATION.items() if key != "id"}
    code, _, turns = convert(tmp_path, CONVERSATION, untitled)
    assert code == 0
    assert [t["id"] for t in turns] == ["agent-chat#message-5", "agent-chat#message-7",
                                        "line-2#message-5", "line-2#message-7"]
    messages = CONVERSATION["messages"]
    assert [(len(t["messages"]), t["messages"][-1]["content"]) for t in turns] == [
        (6, messages[5]["content"]), (8, messages[7]["content"])] * 2
    assert all(t["documents"] == CONVERSATION["documents"] for t in turns)
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps(RULES), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    done = rt4("verify", str(tmp_path / "turns.jsonl"), "--judge", f"scripted:{rules}", "--decomposer", "rules",
               "--no-cache", "--out", str(out), "-q", cwd=tmp_path)
    assert done.returncode == 1
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    found = [[(c["text"], c["label"], c.get("earlier_turn_only", False)) for c in r["claims"]] for r in records]
    assert found[0] == [("Rain is expected.", "entailed", False),
                        ("The airport train runs every 10 minutes.", "baseless", False)]  # nothing before says so
    # In the last turn the same claim rests only on the earlier turn: baseless, and marked so.
    assert ("The airport train runs every 10 minutes.", "baseless", True) in found[1]
    assert found[2:] == found[:2]


def test_a_line_that_is_no_conversation_stops_the_conversion_with_its_place(tmp_path: Path) -> None:
    for line, problem in [
        ({**CONVERSATION, "answer_message": 5}, "answer_message: every assistant turn becomes a line of its own"),
        ({"id": "x", "context": "c", "answer": "a"}, "messages: a list of OpenAI-style chat messages"),
        ({**CONVERSATION, "answer": "x"}, "a conversation's answer, question and context come from its messages"),
    ]:
        code, stderr, _ = convert(tmp_path, CONVERSATION, line)
        assert code == EXIT_USAGE
        assert f"chats.jsonl:2: {problem}" in " ".join(stderr.split())


def test_rt4_eval_refuses_conversations_it_has_no_gold_for(tmp_path: Path) -> None:
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps(CONVERSATION) + "\n", encoding="utf-8")
    done = rt4("eval", "conversations", "--path", str(chats), "--judge", "scripted:" + str(tmp_path / "none.json"),
               cwd=tmp_path)
    assert done.returncode == EXIT_USAGE
    assert "conversations has no gold labels to score against" in " ".join(done.stderr.split())
