"""Reading the final answer a completion states, the way a careful grader reads it.

The completion is first cut where the response ends: at special stop strings, and where the
model starts a new few-shot question (a line opening with ``Q:`` or ``Question:``, the stop
sequences of the BBH and MMLU-Pro evaluators). Then the rules below are tried in order, the
first that yields an answer wins; within one rule the last occurrence that yields an answer wins
(the model's final statement). Every answer comes with the name of its rule, recorded beside the
verdict (docs/SCORING.md "Extraction" lists the rules per answer kind).

A marker's *span* is the rest of its sentence (up to ". ", a newline or the end; the next line
when the marker ends its line). From a span, numeric answers take the leading LaTeX value or
number (thousands separators and currency dropped, ``%`` kept for FinQA, then the first number of
the sentence, or simple number words: "twenty-three"), so trailing units, words and
parentheticals ("16 people.", "595 (from steps 1 to 6)") are ignored.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..tasks.extract import cut_at_stop


@dataclass(frozen=True)
class Extracted:
    """The answer a completion states (``None`` when no rule found one) and the rule's name."""

    answer: str | None
    rule: str


NONE = Extracted(None, "none")


def extract_number(text: str) -> Extracted:
    """A numeric answer (GSM8K, MATH-500's numeric answers, FinQA, BBH's counts): boxed, ####,
    "final answer", "answer is", "answer:", a bold number, else the last number in the text."""
    text = response_text(text)
    found = _boxed_then_markers(text, _number_or_value, _NUMBER_MARKERS, number_in)
    if found is not None:
        return found
    bold = _last(_BOLD.findall(text), _bold_number)
    if bold is not None:
        return Extracted(bold, "bold")
    last = last_number(text)
    return Extracted(last, "last number") if last is not None else NONE


def extract_latex(text: str) -> Extracted:
    """A LaTeX answer (MATH-500): boxed, then the markers' spans as written, else the last number."""
    text = response_text(text)
    if (found := _boxed_then_markers(text, lambda s: s, _NUMBER_MARKERS, _latex_span)) is not None:
        return found
    last = last_number(text)
    return Extracted(last, "last number") if last is not None else NONE


def extract_letter(text: str, options: list[str]) -> Extracted:
    """A multiple-choice letter: boxed, "answer is (C)", "Answer: C", a stated option text, a
    bold letter, the last "(C)", a line opening with a letter, the last standalone letter."""
    text = response_text(text)
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:len(options)]
    lead = _letter_lead(letters)
    boxed = _last(_boxed_contents(text), lambda s: _match_group(lead, _unwrap(s)))
    if boxed is not None:
        return Extracted(boxed, "boxed")
    spans = {rule: _spans(text, marker) for rule, marker in _CHOICE_MARKERS}
    for rule, _ in _CHOICE_MARKERS:
        found = _last(spans[rule], lambda s: _match_group(lead, s))
        if found is not None:
            return Extracted(found, rule)
    stated = [text] + [s for rule, _ in _CHOICE_MARKERS for s in spans[rule]]
    found = _last(stated, lambda s: _option_with_text(s, options, letters))
    if found is not None:
        return Extracted(found, "option text")
    bold = _last(_BOLD.findall(text), lambda s: _match_group(lead, s, whole=True))
    if bold is not None:
        return Extracted(bold, "bold")
    parenthesized = re.findall(rf"\(([{letters}])\)", text)
    if parenthesized:
        return Extracted(parenthesized[-1], "(X)")
    line = _last(text.splitlines(), lambda s: _match_group(lead, s, whole=True))
    if line is not None:
        return Extracted(line, "letter line")
    # MMLU-Pro's last fallback, without the article "A" and the pronoun "I" ("A car", "I think")
    alone = re.findall(rf"(?<![A-Za-z0-9'’])([{letters}])(?![A-Za-z0-9'’])(?! [a-z])", text)
    return Extracted(alone[-1], "last letter") if alone else NONE


def extract_label(text: str, labels: list[str]) -> Extracted:
    """One of a closed set of labels (yes/no/maybe, True/False, valid/invalid): boxed, "answer
    is", "answer:", a bold label, the first word, else the last label in the text."""
    text = response_text(text)
    words = "|".join(re.escape(label) for label in sorted(labels, key=len, reverse=True))
    lead = re.compile(rf"^[\s*_\"'`(\[]*({words})(?![\w-])", re.IGNORECASE)
    canonical = {label.lower(): label for label in labels}

    def label_in(span: str) -> str | None:
        m = lead.match(_unwrap(span))
        return canonical[m.group(1).lower()] if m else None

    if (found := _boxed_then_markers(text, label_in, _CHOICE_MARKERS, label_in)) is not None:
        return found
    bold = _last(_BOLD.findall(text), lambda s: label_in(s) if len(s.split()) == 1 else None)
    if bold is not None:
        return Extracted(bold, "bold")
    first = label_in(text)
    if first is not None:
        return Extracted(first, "first word")
    every = re.findall(rf"(?<![\w-])({words})(?![\w-])", text, re.IGNORECASE)
    return Extracted(canonical[every[-1].lower()], "last label") if every else NONE


def extract_text(text: str) -> Extracted:
    """A free-form answer (BBH's Dyck languages, word sorting): boxed, "answer is", "answer:";
    the rest of the sentence (BBH's "So the answer is X.")."""
    text = response_text(text)
    found = _boxed_then_markers(text, lambda s: _unwrap(s).strip() or None, _CHOICE_MARKERS,
                                _text_span)
    return found if found is not None else NONE


# ---------------------------------------------------------------------------------------------
# The response, markers and spans

_CONTINUATION = re.compile(r"\n[ \t]*(?:Q|Question)[ \t]*:")
_BOLD = re.compile(r"\*\*([^*\n]{1,80}?)\*\*|__([^_\n]{1,80}?)__")
_ANSWER_IS = re.compile(r"\banswer\s+is\b", re.IGNORECASE)
_ANSWER_COLON = re.compile(r"\banswer\s*[*_]*\s*:", re.IGNORECASE)
_NUMBER_MARKERS = [("####", re.compile(r"####")),
                   ("final answer", re.compile(r"\bfinal\s+answer\b", re.IGNORECASE)),
                   ("answer is", _ANSWER_IS),
                   ("answer:", _ANSWER_COLON)]
_CHOICE_MARKERS = [("answer is", re.compile(r"\b(?:answer|option|choice)\s+is\b", re.IGNORECASE)),
                   ("answer:", _ANSWER_COLON)]
_SPAN_OPENING = re.compile(r"^(?:[\s*_:=]|\bis\b)*", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?=\s|$)|\n")


def response_text(text: str) -> str:
    """The response alone: cut at special stop strings and at a new few-shot question."""
    text = cut_at_stop(text)
    m = _CONTINUATION.search(text)
    return text[:m.start()] if m else text


def _boxed_then_markers(text: str, parse_boxed, markers, parse_span) -> Extracted | None:
    """The first rules of every extractor: the last \\boxed{} that parses, else the last span
    of the first marker (in ``markers``' order) with one that parses; None if neither."""
    boxed = _last(_boxed_contents(text), parse_boxed)
    if boxed is not None:
        return Extracted(boxed, "boxed")
    for rule, marker in markers:
        found = _last(_spans(text, marker), parse_span)
        if found is not None:
            return Extracted(found, rule)
    return None


def _spans(text: str, marker: re.Pattern) -> list[str]:
    """The text after each occurrence of ``marker``, up to the end of its sentence;
    blank lines after a marker that ends its line are skipped ("**Final Answer**\\n\\n42")."""
    spans = []
    for m in marker.finditer(text):
        rest = text[m.end():]
        rest = rest[_SPAN_OPENING.match(rest).end():]
        end = _SENTENCE_END.search(rest)
        spans.append(rest[:end.start()] if end else rest)
    return spans


def _last(candidates, read) -> str | None:
    """The last candidate that ``read`` turns into an answer."""
    for c in reversed(candidates):
        if isinstance(c, tuple):  # alternatives of one regex match
            c = next((x for x in c if x), "")
        value = read(c)
        if value is not None:
            return value
    return None


def _boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` / ``\\fbox{...}`` (braces matched), in order."""
    out = []
    for m in re.finditer(r"\\(?:boxed|fbox)\s*", text):
        i = m.end()
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                if depth == 0:
                    out.append(text[i + 1:j])
                    break
        else:
            tail = re.match(r"[^\s$]+", text[i:])  # "\boxed 5"
            if tail:
                out.append(tail.group(0))
    return out


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}``, braces matched."""
    boxed = _boxed_contents(text)
    return boxed[-1] if boxed else None


def _unwrap(s: str) -> str:
    """Markup around an answer: LaTeX math delimiters, \\text{}, bold, spacing commands."""
    s = re.sub(r"\\(?:text|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\(", "").replace("\\)", "").replace("\\[", "").replace("\\]", "")
    s = s.replace("\\$", "$").replace("\\%", "%")
    for junk in ("\\,", "\\!", "\\;", "\\ ", "**", "$$"):
        s = s.replace(junk, " " if junk == "\\ " else "")
    return s.replace("−", "-").replace("–", "-")


def _latex_span(span: str) -> str | None:
    """A LaTeX answer as stated: the leading math segment, else the sentence without ``$``; a
    plain number loses its thousands separators and currency."""
    math = re.match(r"\s*(?:\$([^$]+)\$|\\\((.+?)\\\))", span)
    text = (math.group(1) or math.group(2)) if math else span.replace("$", "")
    text = text.strip().strip("*").strip()
    if re.fullmatch(rf"\$?\s?(?:{_NUMBER_TOKEN})", text):
        return _clean(text.lstrip("$ "))
    return text or None


# ---------------------------------------------------------------------------------------------
# Numbers

_NUMBER_TOKEN = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+"
_NUMBER = re.compile(rf"(?<![\w.])\$?\s?({_NUMBER_TOKEN})(\s?%)?")
_FRACTION = re.compile(r"[-+]?\d+/\d+(?![\d.])")
_LEADING_FILLER = re.compile(r"^(?:[\s:=≈~(\[\"'`*_$€£¥]|\b(?:is|of|about|approximately|"
                             r"around|roughly|exactly|just|only|equal to|a total of)\b)*",
                             re.IGNORECASE)


def number_in(span: str) -> str | None:
    """The number a span states: its leading LaTeX value, fraction or number (``%`` kept), its
    leading number words, else the first number in it; ``None`` when it states none."""
    math = re.match(r"\s*(?:\$([^$]+)\$|\\\((.+?)\\\))", span)
    if math:
        value = _number_or_value(math.group(1) or math.group(2))
        if value is not None:
            return value
    s = _unwrap(span)
    s = s[_LEADING_FILLER.match(s).end():]
    fraction = _FRACTION.match(s)
    if fraction:
        return fraction.group(0)
    lead = _NUMBER.match(s)
    if lead:
        return _clean(lead.group(1)) + ("%" if lead.group(2) else "")
    words = number_words(s)
    if words is not None:
        return str(words)
    first = _NUMBER.search(s)
    return _clean(first.group(1)) + ("%" if first.group(2) else "") if first else None


def _number_or_value(s: str) -> str | None:
    """A boxed or $-delimited numeric answer: a LaTeX expression (\\frac{3}{4}, 2\\sqrt{3}) as
    written, for the comparison to evaluate; otherwise the number it states ("16 \\text{ people}")."""
    unwrapped = _unwrap(s)
    if re.search(r"\\[a-zA-Z]|\^|\d\s*/\s*\d", unwrapped):
        return s.strip()
    return number_in(unwrapped)


def _bold_number(s: str) -> str | None:
    """A bold span that is a number, maybe with a unit ("**42**", "**$1,234**", "**16 people**")."""
    s = _unwrap(s).strip()
    if len(s.split()) > 3 or not _NUMBER.match(s[_LEADING_FILLER.match(s).end():]):
        return None
    return number_in(s)


def _clean(number: str) -> str:
    return number.replace(",", "").lstrip("+")


def clean_number(s: str) -> str:
    """GSM8K normalization: drop ``,`` ``$`` and a trailing ``.``."""
    s = s.replace(",", "").replace("$", "").strip()
    return s[:-1] if s.endswith(".") else s


def gsm8k_strict(text: str) -> str | None:
    """GSM8K's reference: the number after the first ``####``."""
    m = re.search(r"####\s*\$?\s*(-?[0-9.,]+)", text)
    return clean_number(m.group(1)) if m else None


def final_answer(text: str) -> str | None:
    """The stated answer of a math completion, LaTeX as written (``extract_latex``)."""
    return extract_latex(text).answer


def last_number(text: str) -> str | None:
    """The last number in the text (GSM8K's "flexible" extraction)."""
    found = _NUMBER.findall(_unwrap(text))
    return _clean(found[-1][0]) + ("%" if found[-1][1] else "") if found else None


_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * i for i, w in enumerate(
    "twenty thirty forty fifty sixty seventy eighty ninety".split(), start=2)}
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9}


def number_words(s: str) -> int | None:
    """The value of leading English number words ("twenty-three", "one hundred and five")."""
    words = re.findall(r"[a-z]+|[^a-z\s-]", s.lower())
    total = current = 0
    used = 0
    for i, w in enumerate(words):
        if w in _UNITS:
            current += _UNITS[w]
        elif w in _TENS:
            current += _TENS[w]
        elif w == "hundred" and used:
            current = max(current, 1) * 100
        elif w in _SCALES and used:
            total, current = total + max(current, 1) * _SCALES[w], 0
        elif w == "and" and used and i + 1 < len(words) and (
                words[i + 1] in _UNITS or words[i + 1] in _TENS):
            continue
        else:
            break
        used += 1
    return total + current if used else None


# ---------------------------------------------------------------------------------------------
# Letters and option texts


def _letter_lead(letters: str) -> re.Pattern:
    """A letter opening a span: "C", "(C)", "(c)", "[C]", "option C", "**C**", "C) text"."""
    lower = letters.lower()
    return re.compile(rf"^[\s*_:=]*(?:(?i:option|choice|letter)\s+)?[*_]*\s*"
                      rf"(?:\(\s*([{letters}{lower}])\s*\)|\[([{letters}])\]|([{letters}])"
                      rf"(?![A-Za-z0-9'’]))")


def _match_group(lead: re.Pattern, s: str, whole: bool = False) -> str | None:
    """The letter opening ``s`` (with ``whole``: ``s`` holds only the letter, perhaps followed
    by punctuation and the option text, e.g. a line "C. Paris")."""
    s = _unwrap(s)
    m = lead.match(s)
    if not m:
        return None
    if whole and not re.match(r"^\s*(?:[.)\]*_]|$|\s+\S)", s[m.end():]):
        return None
    if whole and re.match(r"^\s+[a-z]", s[m.end():]) and not re.match(r"^\s*\(", s):
        return None  # "A car", "I think": an article or pronoun, not a letter
    return next(g for g in m.groups() if g).upper()


def _option_with_text(span: str, options: list[str], letters: str) -> str | None:
    """The letter of the option whose text the span states ("The answer is Paris.")."""
    said = _normal(span)
    if not said:
        return None
    for letter, option in zip(letters, options):
        if said == _normal(option):
            return letter
    return None


def _normal(s: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[*_`\"“”]|\.\s*$", "", _unwrap(s))).strip().lower()


def _text_span(span: str) -> str | None:
    s = _unwrap(span).strip().strip("*_`\"").strip()
    s = s[:-1].rstrip() if s.endswith(".") else s
    return s or None
