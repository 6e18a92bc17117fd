"""The language of a text: given by the caller or detected offline, as an ISO 639-1 code.

Detection uses ``py3langid`` (langid.py's maintained fork: a 4.5 MB naive-Bayes model over byte
n-grams for 97 languages, numpy only, no network, about 0.1 ms a text once loaded). Its model takes
a few seconds to load, so it is loaded on the first text that needs it, and a text that reads as
English by its function words never loads it: English runs cost what they did before.

What a language changes downstream: which sentence splitter :mod:`rt4chart.method.text` uses, the line
prompts add for the judge (:mod:`rt4chart.method.prompts`), and whether the embedded verifier, an English
model, may judge the sample.
"""

from __future__ import annotations

import re
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from py3langid.langid import LanguageIdentifier

ENGLISH = "en"
"""The default language, and the one every English-only part of rt4chart was built for."""

LANGUAGE_NAMES: dict[str, str] = {
    "af": "Afrikaans", "ar": "Arabic", "bg": "Bulgarian", "bn": "Bengali", "ca": "Catalan", "cs": "Czech",
    "cy": "Welsh", "da": "Danish", "de": "German", "el": "Greek", "en": "English", "es": "Spanish",
    "et": "Estonian", "eu": "Basque", "fa": "Persian", "fi": "Finnish", "fr": "French", "ga": "Irish",
    "gl": "Galician", "gu": "Gujarati", "he": "Hebrew", "hi": "Hindi", "hr": "Croatian", "hu": "Hungarian",
    "hy": "Armenian", "id": "Indonesian", "is": "Icelandic", "it": "Italian", "ja": "Japanese",
    "ka": "Georgian", "km": "Khmer", "kn": "Kannada", "ko": "Korean", "lo": "Lao", "lt": "Lithuanian",
    "lv": "Latvian", "mk": "Macedonian", "ml": "Malayalam", "mr": "Marathi", "ms": "Malay", "my": "Burmese",
    "nb": "Norwegian", "ne": "Nepali", "nl": "Dutch", "no": "Norwegian", "pa": "Punjabi", "pl": "Polish",
    "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sk": "Slovak", "sl": "Slovene", "sq": "Albanian",
    "sr": "Serbian", "sv": "Swedish", "sw": "Swahili", "ta": "Tamil", "te": "Telugu", "th": "Thai",
    "tl": "Tagalog", "tr": "Turkish", "uk": "Ukrainian", "ur": "Urdu", "vi": "Vietnamese", "zh": "Chinese",
}  # fmt: skip
"""English names of the languages rt4chart knows by code (what a prompt tells the judge)."""

_BY_NAME = {name.lower(): code for code, name in LANGUAGE_NAMES.items()}
_CODE = re.compile(r"[a-z]{2,3}")
ISO_639_1 = frozenset(
    [
        "aa", "ab", "ae", "af", "ak", "am", "an", "ar", "as", "av", "ay", "az", "ba", "be", "bg", "bh", "bi", "bm",
        "bn", "bo", "br", "bs", "ca", "ce", "ch", "co", "cr", "cs", "cu", "cv", "cy", "da", "de", "dv", "dz", "ee",
        "el", "en", "eo", "es", "et", "eu", "fa", "ff", "fi", "fj", "fo", "fr", "fy", "ga", "gd", "gl", "gn", "gu",
        "gv", "ha", "he", "hi", "ho", "hr", "ht", "hu", "hy", "hz", "ia", "id", "ie", "ig", "ii", "ik", "io", "is",
        "it", "iu", "ja", "jv", "ka", "kg", "ki", "kj", "kk", "kl", "km", "kn", "ko", "kr", "ks", "ku", "kv", "kw",
        "ky", "la", "lb", "lg", "li", "ln", "lo", "lt", "lu", "lv", "mg", "mh", "mi", "mk", "ml", "mn", "mr", "ms",
        "mt", "my", "na", "nb", "nd", "ne", "ng", "nl", "nn", "no", "nr", "nv", "ny", "oc", "oj", "om", "or", "os",
        "pa", "pi", "pl", "ps", "pt", "qu", "rm", "rn", "ro", "ru", "rw", "sa", "sc", "sd", "se", "sg", "si", "sk",
        "sl", "sm", "sn", "so", "sq", "sr", "ss", "st", "su", "sv", "sw", "ta", "te", "tg", "th", "ti", "tk", "tl",
        "tn", "to", "tr", "ts", "tt", "tw", "ty", "ug", "uk", "ur", "uz", "ve", "vi", "vo", "wa", "wo", "xh", "yi",
        "yo", "za", "zh", "zu",
    ]
)
"""Every two-letter code of ISO 639-1: a two-letter code outside it (``xx``) names no language.
Three-letter codes (ISO 639-2/3: ``yue``, ``wuu``) are taken as given."""


def normalize_language(value: str) -> str:
    """The ISO 639-1 code of ``value``: a code (``de``), a BCP 47 tag (``pt-BR``, ``zh_Hans``) or an
    English name (``German``). Raises ``ValueError`` for anything else."""
    text = value.strip().lower().replace("_", "-")
    if text in _BY_NAME:
        return _BY_NAME[text]
    base = text.split("-", 1)[0]
    if not _CODE.fullmatch(base) or (len(base) == 2 and base not in ISO_639_1):
        raise ValueError(f"not a language code or name: {value!r} (use an ISO 639-1 code such as 'de' or 'ja')")
    return "nb" if base == "no" else base


def language_name(code: str) -> str:
    """The English name of ``code`` (the code itself for one rt4chart has no name for)."""
    return LANGUAGE_NAMES.get(code, code)


_ENGLISH_MARKERS = frozenset(
    ["the", "and", "with", "that", "this", "which", "has", "have", "been", "they", "their", "there", "were",
     "from", "are", "its", "it", "would"]
)  # fmt: skip
"""Function words that are English and no other Latin-script language's ("was" is German and Dutch
too): a text mostly in ASCII letters with enough of them is English without asking the model."""
_ASCII_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")

MIN_CONFIDENCE = 0.3
"""The detector's normalised probability below which its guess is not taken (short texts such as
"Paris." or "Yes, 42%." score under 0.1): the text then counts as English, rt4chart's default.
Chosen on Mu-SHROOM's dev split (499 answers in 10 languages: 96.8% right at 0.2 and 0.3, 95.4% at
0.5), the higher of the two best; no English answer of RAGTruth QA dev or FaithBench is taken for
another language at it."""

_WRITTEN_AS = {"wuu": "zh", "arz": "ar", "ary": "ar", "acm": "ar", "apc": "ar"}
"""Varieties the detector tells apart that are written, split and prompted as their standard
language: Mandarin answers often score as Wu; Egyptian and Moroccan Arabic are Arabic script."""


def _reads_as_english(text: str) -> bool:
    # The detector reads bytes, so a few words of a three-byte script outweigh an English paragraph
    # ("The owner is Ana Müller. 店は駅の近くにあります。" scores as Japanese): English words that
    # make most of the letters decide first.
    letters = "".join(filter(str.isalpha, text))
    if len(letters.encode("ascii", "ignore")) < 0.5 * len(letters):  # ASCII letters: one byte each
        return False
    words = [word.lower() for word in _ASCII_WORD.findall(text)]
    markers = sum(word in _ENGLISH_MARKERS for word in words)
    return markers >= 1 and markers >= 0.1 * len(words)


@cache
def _identifier() -> LanguageIdentifier:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def load_detector() -> None:
    """Load the language detector now rather than on the first answer that needs it: the load
    (an LZMA-packed model) takes a second or more of CPU, and a service (``rt4 guard``) would
    otherwise stall every request in flight while one of them waits on it."""
    _identifier()


def detect_language(text: str, fallback: str = "") -> str:
    """The language of ``text`` (its first 2,000 characters), else of ``fallback`` (more text in the
    same language, such as the context), else English: a guess under :data:`MIN_CONFIDENCE` is
    not taken. A text without a letter or a digit (punctuation, emoji, zero-width spaces, which
    the detector reads as Khmer) has no language of its own."""
    for candidate in (text, f"{text}\n{fallback}" if fallback else ""):
        sample = candidate[:2000]
        if not any(character.isalnum() for character in sample):
            continue
        if _reads_as_english(sample):
            return ENGLISH
        code, confidence = _identifier().classify(sample)
        if confidence >= MIN_CONFIDENCE:
            return _WRITTEN_AS.get(str(code), normalize_language(str(code)))
    return ENGLISH


CJK_LANGUAGES = frozenset({"ja", "zh", "ko", "yue", "wuu"})
"""Languages written (mostly) in Han, kana or hangul, where numbers take East Asian scale words."""


def audit_language(given: str | None, default: str | None, answer: str, context: str | list[str]) -> str:
    """The language a sample is audited in: the input line's ``language``, else ``--language``
    (``default``), else the one detected in the answer (with the context's start as a fallback)."""
    if given or default:
        return given or default or ENGLISH
    context_start = context[:2000] if isinstance(context, str) else "\n".join(context)[:2000]
    return detect_language(answer, context_start)
