# ruff: noqa: RUF001 - the punctuation and digits of other scripts are the point
"""Languages: detection, per-language sentences with exact offsets, numbers and quotes of other
scripts, the judge's prompts, and what the CLI does with a Japanese, German and Chinese answer."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_embedded
from hypothesis import given, settings
from hypothesis import strategies as st

from rt4chart.judges.registry import judge_stack, resolve_judge
from rt4chart.languages import audit_language, detect_language, normalize_language
from rt4chart.method.decompose import claim_problem
from rt4chart.method.grounding import ContextIndex
from rt4chart.method.prompts import localize
from rt4chart.method.session import JudgeSession
from rt4chart.method.tasks import DecomposeInput, build_request, load_prompts
from rt4chart.method.text import content_words, numbers_in, segment_context, split_sentences
from rt4chart.protocol import Message
from rt4chart.records.io import parse_sample
from rt4chart.types import Gold, Sample, Span

ROOT = Path(__file__).resolve().parent.parent


def texts(text: str, language: str) -> list[str]:
    sentences = split_sentences(text, language=language)
    for sentence in sentences:
        assert text[sentence.start : sentence.end] == sentence.text
    return [s.text for s in sentences]


# --- the issue's four examples -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "language", "expected"),
    [
        ("東京は日本の首都です。人口は約1400万人です。", "ja", [(0, 11), (11, 24)]),
        ("北京是中国的首都。人口约2100万！它很大？", "zh", [(0, 9), (9, 18), (18, 22)]),
        ("Der Zug fährt z. B. um 9 Uhr ab. Er kommt um 11 Uhr an.", "de", [(0, 32), (33, 55)]),
        ("Le musée ouvre à 9 h. Il ferme à 17 h.", "fr", [(0, 21), (22, 38)]),
    ],
)
def test_the_issue_examples_split_with_exact_offsets(text: str, language: str, expected: list[tuple[int, int]]) -> None:
    sentences = split_sentences(text, language=language)
    assert [(s.start, s.end) for s in sentences] == expected
    assert [s.text for s in sentences] == [text[start:end] for start, end in expected]
    # Detection finds the same language, so a line without "language" splits the same way.
    assert detect_language(text) == language


# --- hand-written fixtures, one or more per language ---------------------------------------------

FIXTURES: list[tuple[str, str, list[str]]] = [
    ("en", "Dr. Smith arrived at 9 a.m. on Monday. He left at noon.",
     ["Dr. Smith arrived at 9 a.m. on Monday.", "He left at noon."]),
    ("de", "Das kostet ca. 5 Euro, d.h. nicht viel. Am 3. Mai kam er zurück! Warum?",
     ["Das kostet ca. 5 Euro, d.h. nicht viel.", "Am 3. Mai kam er zurück!", "Warum?"]),
    ("de", "Der Zug fährt z. B. um 9 Uhr ab. Er kommt um 11 Uhr an.",
     ["Der Zug fährt z. B. um 9 Uhr ab.", "Er kommt um 11 Uhr an."]),
    ("fr", "Hier, M. Dupont était à Paris. Le musée ferme à 17 h. Il rouvre demain.",
     ["Hier, M. Dupont était à Paris.", "Le musée ferme à 17 h.", "Il rouvre demain."]),
    ("es", "El Sr. García vive en EE. UU. desde 2001. Trabaja en Madrid. ¿Por qué?",
     ["El Sr. García vive en EE. UU. desde 2001.", "Trabaja en Madrid.", "¿Por qué?"]),
    ("pt", "O Sr. Silva chegou às 9 h. Depois saiu. A população é de 2,5 milhões.",
     ["O Sr. Silva chegou às 9 h.", "Depois saiu.", "A população é de 2,5 milhões."]),
    ("it", "Il sig. Rossi è arrivato alle 9. Poi è andato via. Che cosa?",
     ["Il sig. Rossi è arrivato alle 9.", "Poi è andato via.", "Che cosa?"]),
    ("nl", "Het museum is bijv. op maandag dicht. Het opent om 10 uur.",
     ["Het museum is bijv. op maandag dicht.", "Het opent om 10 uur."]),
    ("ja", "「東京は大きい。」と彼は言った。人口は約1400万人です！本当？",
     ["「東京は大きい。」と彼は言った。", "人口は約1400万人です！", "本当？"]),
    ("ja", "富士山の高さは3,776メートルです。（日本で一番高い。）次の文です。",
     ["富士山の高さは3,776メートルです。", "（日本で一番高い。）", "次の文です。"]),
    ("zh", "北京是中国的首都。人口约2100万！它很大吗？“是的。”",
     ["北京是中国的首都。", "人口约2100万！", "它很大吗？", "“是的。”"]),
    ("zh", "版本2.5已经发布。价格是3.5元。",
     ["版本2.5已经发布。", "价格是3.5元。"]),
    ("ko", "서울은 한국의 수도입니다. 인구는 약 950만 명입니다! 정말요?",
     ["서울은 한국의 수도입니다.", "인구는 약 950만 명입니다!", "정말요?"]),
    ("ar", "القاهرة هي عاصمة مصر. هل هي كبيرة؟ نعم، يبلغ عدد سكانها ٢١ مليون.",
     ["القاهرة هي عاصمة مصر.", "هل هي كبيرة؟", "نعم، يبلغ عدد سكانها ٢١ مليون."]),
    ("hi", "दिल्ली भारत की राजधानी है। इसकी आबादी 3.2 करोड़ है। क्या यह बड़ा है?",
     ["दिल्ली भारत की राजधानी है।", "इसकी आबादी 3.2 करोड़ है।", "क्या यह बड़ा है?"]),
    ("th", "กรุงเทพเป็นเมืองหลวงของประเทศไทย ประชากรประมาณ 10 ล้านคน",
     ["กรุงเทพเป็นเมืองหลวงของประเทศไทย", "ประชากรประมาณ 10 ล้านคน"]),
]  # fmt: skip


@pytest.mark.parametrize(("language", "text", "expected"), FIXTURES)
def test_hand_written_fixtures(language: str, text: str, expected: list[str]) -> None:
    assert texts(text, language) == expected


def test_every_fixture_language_is_detected() -> None:
    for language, text, _ in FIXTURES:
        assert detect_language(text) == language, text


def test_lines_and_passages_stay_hard_boundaries_in_every_language() -> None:
    context, sentences = segment_context(["東京は首都です。\n大阪は大きい", "北京是首都。"], "ja")
    assert [s.text for s in sentences] == ["東京は首都です。", "大阪は大きい", "北京是首都。"]
    assert [s.passage for s in sentences] == [0, 0, 1]
    assert all(context[s.start : s.end] == s.text for s in sentences)


# --- properties, per language --------------------------------------------------------------------

WORDS = {
    "en": ["the", "museum", "opens", "Dr.", "at", "9", "a.m.", "Paris", "2.5", "million"],
    "de": ["Der", "Zug", "fährt", "z.", "B.", "um", "9", "Uhr", "ca.", "Euro", "3."],
    "fr": ["Le", "musée", "ouvre", "à", "9", "h.", "M.", "Dupont", "etc."],
    "es": ["El", "Sr.", "García", "vive", "en", "EE.", "UU.", "desde", "2001"],
    "ja": ["東京", "は", "日本", "の", "首都", "です", "1400", "万人", "「", "」"],
    "zh": ["北京", "是", "中国", "的", "首都", "人口", "约", "2100", "万", "“", "”"],
    "ko": ["서울은", "한국의", "수도입니다", "인구는", "950만", "명"],
    "ar": ["القاهرة", "هي", "عاصمة", "مصر", "٢١", "مليون"],
    "hi": ["दिल्ली", "भारत", "की", "राजधानी", "है", "3.2"],
}
TERMINATORS = {"ja": ["。", "！", "？", "。」"], "zh": ["。", "！", "？", "。”"], "hi": ["।", "?"], "ar": [".", "؟"]}
SPACED = {"ja": "", "zh": ""}


@st.composite
def language_texts(draw: st.DrawFn) -> tuple[str, str]:
    language = draw(st.sampled_from(sorted(WORDS)))
    separator = SPACED.get(language, " ")
    sentences = []
    # A line that starts with "B." or "3." starts with a list marker, which is not part of a sentence.
    openers = [word for word in WORDS[language] if not word[0].isdigit() and not word.endswith(".") and len(word) > 1]
    for _ in range(draw(st.integers(1, 5))):
        words = [draw(st.sampled_from(openers)), *draw(st.lists(st.sampled_from(WORDS[language]), max_size=7))]
        end = draw(st.sampled_from(TERMINATORS.get(language, [".", "!", "?"])))
        sentences.append(separator.join(words) + end)
    gap = draw(st.sampled_from([" ", "  ", "\n", " \n "]))
    return language, gap.join(sentences)


@settings(max_examples=150, deadline=None)
@given(language_texts())
def test_offsets_are_exact_no_sentence_is_empty_and_splitting_is_idempotent(case: tuple[str, str]) -> None:
    language, text = case
    sentences = split_sentences(text, language=language)
    assert sentences, text
    for index, sentence in enumerate(sentences):
        assert sentence.index == index
        assert sentence.text and sentence.text == sentence.text.strip()
        assert text[sentence.start : sentence.end] == sentence.text
    assert all(a.end <= b.start for a, b in itertools.pairwise(sentences))
    # The sentences, put back together on lines of their own, split into the same sentences.
    joined = "\n".join(s.text for s in sentences)
    assert [s.text for s in split_sentences(joined, language=language)] == [s.text for s in sentences]


# --- numbers, words and quotes of other scripts ------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("人口は約1400万人です。", 14_000_000.0),
        ("人口约2100万！", 21_000_000.0),
        ("予算は3億円です。", 300_000_000.0),
        ("１４００万人", 14_000_000.0),
        ("인구는 약 950만 명입니다.", 9_500_000.0),
        ("يبلغ عدد سكانها ٢١٠٠ نسمة", 2100.0),
        ("النسبة ٣٫٥ بالمئة", 3.5),
        ("आबादी १४०० है", 1400.0),
        ("The population is 2,500,000.", 2_500_000.0),
    ],
)
def test_numbers_of_other_scripts_and_east_asian_scales(text: str, value: float) -> None:
    assert value in numbers_in(text)


def test_scale_syllables_inside_korean_words_are_not_numbers() -> None:
    assert numbers_in("그는 만들었다 조선") == frozenset()
    assert "만들었다" in content_words("그는 만들었다")


def test_han_and_kana_runs_count_as_character_pairs_and_indic_words_keep_their_vowel_signs() -> None:
    assert content_words("首都です") == ["首都", "都で", "です"]
    assert content_words("जनसंख्या बड़ी") == ["जनसंख्या", "बड़ी"]


def test_quotes_with_full_width_or_ascii_punctuation_anchor_to_the_context_as_written() -> None:
    context, sentences = segment_context("東京は日本の首都です。人口は約１４００万人です。", "ja")
    index = ContextIndex(context, sentences)
    evidence = index.anchor("人口は約1400万人です.")
    assert evidence is not None and evidence.match == "folded"
    assert context[evidence.start : evidence.end] == "人口は約１４００万人です。"
    assert evidence.sentence_ids == [1]


def test_an_inflected_german_noun_is_not_a_name_the_answer_lacks() -> None:
    sentence = "Der Zug fährt vom Bahnhof in Berlin ab."
    claim = "Der Zug des Bahnhofs fährt in Berlin ab."
    assert claim_problem(claim, sentence, sentence, None, "de") is None
    assert "names ['Bahnhofs']" in (claim_problem(claim, sentence, sentence, None) or "")
    assert "shares no word" in (claim_problem("Die Katze schläft im Garten.", sentence, sentence, None, "de") or "")


# --- detection and the language of a sample ----------------------------------------------------


def test_a_line_with_a_bad_language_is_an_error_record_of_its_own() -> None:
    bad = parse_sample({"id": "a", "context": "c", "answer": "x", "language": "x!"}, 3)
    assert bad.sample is None and "not a language code" in (bad.error or "")


def test_normalize_language_takes_codes_tags_and_names() -> None:
    given = ("de", "pt-BR", "zh_Hans", "Japanese", "EN")
    assert [normalize_language(v) for v in given] == ["de", "pt", "zh", "ja", "en"]
    with pytest.raises(ValueError, match="not a language"):
        normalize_language("deutsch!")


def test_english_with_a_few_words_of_another_script_is_english() -> None:
    # Byte n-grams weigh a Japanese clause above an English paragraph; the words decide first.
    assert detect_language("The owner is Ana Müller. It opened in 2005. 店は駅の近くにあります。") == "en"
    assert detect_language("Was ist das? Das ist ein Zug.") == "de"


def test_a_sample_takes_the_lines_language_then_the_option_then_detection() -> None:
    assert Sample(id="a", context="c", answer="x", language="ja-JP").language == "ja"
    assert audit_language("ja", "de", "The answer.", "") == "ja"
    assert audit_language(None, "de", "The answer.", "") == "de"
    assert audit_language(None, None, "Der Zug fährt um 9 Uhr ab.", "") == "de"
    # Too short to tell on its own: the context decides; nothing to tell by: English.
    assert audit_language(None, None, "Ja.", "Der Zug fährt um 9 Uhr ab und kommt um 11 Uhr an.") == "de"
    assert audit_language(None, None, "42.", "") == "en"


# --- prompts -----------------------------------------------------------------------------------


def test_prompts_say_the_language_and_english_prompts_are_unchanged() -> None:
    prompts = load_prompts()
    payload = DecomposeInput(question=None, sentences=["東京は日本の首都です。"])
    english = JudgeSession(backend=None, prompts=prompts).request(payload)  # type: ignore[arg-type]
    japanese = JudgeSession(backend=None, prompts=prompts, language="ja").request(payload)  # type: ignore[arg-type]
    before = build_request(payload, prompts)  # what every English run sent before: same cache keys
    assert english.model_dump() == before.model_dump() and english.output_schema is before.output_schema
    assert "Japanese" not in english.messages[0].content
    assert japanese.messages[0].content.startswith(english.messages[0].content)
    assert "written in Japanese" in japanese.messages[0].content
    assert "exactly as it is written there" in japanese.messages[0].content
    assert japanese.messages[1:] == english.messages[1:]
    assert japanese.prompt_version != english.prompt_version
    messages = [Message(role="system", content="s"), Message(role="user", content="u")]
    assert localize(messages, "v1", "en") == (messages, "v1")


# --- the real CLI ------------------------------------------------------------------------------


def rt4(*args: str, cwd: Path, columns: str = "120") -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "COLUMNS": columns}
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


SAMPLES = [
    {
        "id": "ja",
        "context": "東京は日本の首都です。東京の人口は約1400万人です。大阪は西にあります。",
        "answer": "東京は日本の首都です。人口は約1400万人です。",
    },
    {
        "id": "de",
        "context": "Der Zug fährt z. B. um 9 Uhr ab. Er kommt um 11 Uhr in Berlin an. Die Fahrt kostet 30 Euro.",
        "answer": "Der Zug fährt z. B. um 9 Uhr ab. Er kommt um 11 Uhr an.",
    },
]
EVIDENCE = {
    "東京は日本の首都です。": "東京は日本の首都です。",
    "人口は約1400万人です。": "東京の人口は約1400万人です。",
    "Der Zug fährt z. B. um 9 Uhr ab.": "Der Zug fährt z. B. um 9 Uhr ab.",
    "Er kommt um 11 Uhr an.": "Er kommt um 11 Uhr in Berlin an.",
}


def test_verify_with_the_scripted_judge_gives_one_claim_per_sentence_in_japanese_and_german(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in SAMPLES), "utf-8")
    rules = {
        "verify": [{"claim": claim, "label": "entailed", "evidence": [quote]} for claim, quote in EVIDENCE.items()],
        "default": "baseless",
    }
    (tmp_path / "rules.json").write_text(json.dumps(rules, ensure_ascii=False), "utf-8")
    result = rt4("verify", "in.jsonl", "--judge", "scripted:rules.json", "--decomposer", "judge", "--no-cache",
                 "--out", "out.jsonl", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text("utf-8").splitlines()]
    for sample, record in zip(SAMPLES, records, strict=True):
        assert record["language"] == sample["id"]
        assert record["label"] == "entailed"
        answer, context = sample["answer"], sample["context"]
        claims = record["claims"]
        assert len(claims) == 2, claims
        for claim in claims:
            span = claim["answer_span"]
            sentence = answer[span["start"] : span["end"]]
            assert claim["text"] == sentence
            (evidence,) = claim["evidence"]
            assert context[evidence["start"] : evidence["end"]] == EVIDENCE[sentence] == evidence["text"]
            assert evidence["match"] == "exact"
        assert record["context_sentences"] == 3


def test_the_embedded_judge_leaves_a_chinese_answer_open_with_an_error(tmp_path: Path) -> None:
    require_embedded()
    samples = [
        {"id": "zh", "context": "北京是中国的首都。人口约2100万。", "answer": "北京是中国的首都。人口约3000万！"},
        {"id": "en", "context": "Paris is the capital of France.", "answer": "Paris is the capital of France."},
    ]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples), "utf-8")
    result = rt4("verify", "in.jsonl", "--judge", "embedded", "--no-cache", "--out", "out.jsonl", cwd=tmp_path)
    assert result.returncode == 4, result.stderr
    chinese, english = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text("utf-8").splitlines()]
    assert chinese["language"] == "zh"
    assert chinese["label"] is None and chinese["claims"] == [] and chinese["incomplete"] is True
    assert "serves en only" in chinese["errors"][0] and "Chinese (zh)" in chinese["errors"][0]
    assert english["language"] == "en" and english["label"] == "entailed"
    # Asked for the whole run in Chinese, it refuses before any work.
    refused = rt4("verify", "in.jsonl", "--judge", "embedded", "--language", "zh", "--no-cache", cwd=tmp_path)
    assert refused.returncode == 2 and "serves en only" in refused.stderr


def test_a_cascade_or_vote_with_the_embedded_judge_serves_english_only(tmp_path: Path) -> None:
    require_embedded()
    rules = tmp_path / "rules.json"
    rules.write_text('{"default": "entailed"}', "utf-8")
    cascade = resolve_judge(f"cascade:embedded@0.9,scripted:{rules}")
    assert cascade.capabilities.languages == frozenset({"en"})
    assert "serves en only" in (cascade.capabilities.language_refusal("zh", cascade.name) or "")
    assert cascade.capabilities.language_refusal("en", cascade.name) is None
    assert resolve_judge(f"vote:scripted:{rules},scripted:{rules}").capabilities.languages is None
    # The stack's wrappers (budget meter, cache) forward what the judge declares.
    assert judge_stack(f"cascade:embedded@0.9,scripted:{rules}", cache=tmp_path / "c").capabilities.languages == {"en"}


def test_rt4_judges_says_which_languages_each_judge_serves(tmp_path: Path) -> None:
    result = rt4("judges", cwd=tmp_path, columns="250")
    assert result.returncode == 0, result.stderr
    header = next(line for line in result.stdout.splitlines() if "┃ judge" in line)
    assert header.split("┃")[-2].strip() == "languages"
    cells = [line.split("│") for line in result.stdout.splitlines() if line.count("│") > 8]
    rows = {cell[1].strip(): cell[-2].strip() for cell in cells}
    assert rows["embedded"] == "en"
    assert rows["gpt-4o-mini"] == "any"


def test_the_mu_shroom_segmentation_eval_measures_per_language() -> None:
    sys.path.insert(0, str(ROOT / "evals" / "languages"))
    try:
        import run as segmentation_eval  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    answer = "北京是中国的首都。人口约3000万！"
    gold = Gold(hallucinated=True, spans=[Span(start=12, end=17)])
    samples = [Sample(id="1", context="", answer=answer, language="zh", gold=gold)]
    (row,) = segmentation_eval.measure(samples).values()
    assert row["sentences_mean"] == 2 and row["sentences_mean_english_punkt"] == 1
    assert row["offsets_exact"] is True
    # The flagged sentence holds 5 of its 9 characters; the whole answer 5 of 18.
    assert row["iou_sentences"] == round(5 / 9, 3) and row["iou_whole_answer"] == round(5 / 18, 3)
