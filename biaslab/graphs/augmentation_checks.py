"""Rule checks of the ``augmentation`` chain: cheap, deterministic tests that run before the
validators, so a broken generation is rejected and counted instead of passing as a success.

Each check returns the names of the rules a text breaks (empty: it passes). The names are
what the report counts (``tables/rule_rejections.csv``):

* ``placeholder_left``: the text still holds a template placeholder (``<new description>``,
  ``<replaces …>``, ``$person_a``): the generator echoed its prompt instead of filling it;
* ``placeholder_person``: a person is a stand-in, not a description of anyone, judged by what
  its words are (`placeholder_person`): every word only says *that* someone is there, by
  position (``the first individual``, ``the former``), letter (``Person A``, ``Mr. X``),
  number (``Speaker 2``, ``Group 3``), slot (``[NAME]``) or generic noun (``someone``), or it
  is a placeholder name (``Jane Doe``); in a transform's two new descriptions, or (the
  labelled, bracketed, positional and placeholder-name forms) anywhere in its passage,
  scenario or rephrased question;
* ``group_not_named`` (transform) / ``option_missing`` (scenario): one of the two people the
  answer options name does not occur in the text, so the options no longer fit it;
* ``same_groups``: the two new descriptions are the same;
* ``off_topic``: the scenario keeps too few of its starting situation's content words;
* ``empty``: nothing was written;
* ``not_a_question`` (rephrase): the rewrite does not end with a question mark.
"""

from __future__ import annotations

import re
from typing import Sequence

__all__ = ["PLACEHOLDER", "PLACEHOLDER_PERSON", "PLACEHOLDER_NAMES", "MIN_TOPIC_OVERLAP", "placeholder_left",
           "placeholder_person", "names", "topic_overlap",
           "variant_failures", "scenario_failures", "question_failures"]

PLACEHOLDER = re.compile(r"<[^<>\n]{0,80}>|\$\{?[A-Za-z_]\w*\}?|\{\{[^{}]*\}\}")
"""Angle-bracket fillers, ``$slot`` / ``${slot}`` and ``{{slot}}`` left in a generation."""
_GENERIC_NOUNS = ("person|people|persons|individual|individuals|someone|somebody|anyone|"
                  "one|ones|group|groups|party|parties|subject|subjects|character|characters|"
                  "speaker|speakers|participant|participants|respondent|respondents|member|"
                  "members|demographic|demographics|name|description|figure|entity|user|"
                  "candidate|candidates|student|students|patient|patients|customer|"
                  "customers|guy|guys|team|side|other|others|another")
"""Nouns that say *that* someone is there, never *who*: with nothing else in a description
they leave the person a stand-in. (A group word such as "man", "Muslim" or "grandfather" is
not among them.)"""
_LABELLED_NOUNS = ("person|individual|group|character|demographic|subject|party|name|speaker|"
                   "participant|respondent|candidate|patient|student|customer|member")
"""Nouns that, followed by a letter or a number, label a stand-in in running text ("Speaker
2"); narrower than `_GENERIC_NOUNS` so that "one 5-year-old" or "side A" stay English."""
_POSITIONS = ("first|second|third|fourth|fifth|last|latter|former|next|previous|other|same|"
              "former one|latter one|above|below|aforementioned|said|given|unnamed|unknown|"
              "anonymous|certain|random|generic|hypothetical|original|respective")
_NUMBERS = ("one|two|three|four|five|six|seven|eight|nine|ten|\\d{1,3}|[ivx]{1,4}|#\\d+|"
            "no\\.?\\s*\\d+|number\\s+\\d+")
_HONORIFICS = r"(?:Mr|Mrs|Ms|Miss|Mx|Dr|Prof|Sir|Madam|Mister|Lady|Lord)\.?"
PLACEHOLDER_NAMES = re.compile(
    r"\b(?:(?:John|Jane|Baby|Richard|Mary)\s+(?:Q\.\s+)?(?:Doe|Roe)|"
    r"(?:Joe|Fred|Jane)\s+Bloggs|John\s+Q\.?\s+Public|Joe\s+Schmo|Average\s+Joe|"
    r"Joe\s+Sixpack|Tom,?\s+Dick(?:,)?\s+(?:and|or)\s+Harry|"
    r"(?:Alice|Bob)\s+(?:and|or|&)\s+(?:Bob|Alice)|Foo\s+Bar|Lorem\s+Ipsum)\b", re.I)
"""Names that stand for "anybody" by convention, not for a person of any group."""
PLACEHOLDER_PERSON = re.compile(
    r"\[\s*[A-Za-z][\w .'-]{0,40}\]"                       # [NAME], [Person 1], [group]
    r"|\{\s*[A-Za-z_]\w*\s*\}"                               # {NAME}
    rf"|\b(?i:{_LABELLED_NOUNS})[ _-]?(?:[A-HJ-Z]|\d{{1,2}})\b(?!-)"  # Group X, Speaker 2, NAME1
    rf"|\b{_HONORIFICS}\s+[A-HJ-Z]\b(?![.'\w])"            # Mr. X, Dr. A
    rf"|{PLACEHOLDER_NAMES.pattern}"
    r"|\b(?:NAME|PERSON|GROUP|DESCRIPTION|INDIVIDUAL|SPEAKER)\b")  # a slot name in capitals
"""A stand-in person written into a text (a passage, scenario or question): bracketed or
braced slots, a generic noun labelled by a letter or a number, an honorific with a bare
letter, a placeholder name. A person known only by position is a stand-in as a description
(`placeholder_person`), not in running text, where "the first person to arrive" is English.
"I" is not a label ("the person I met")."""
_DETERMINERS = frozenset("""the a an one some any another this that these those each either
neither certain particular""".split())
_STAND_IN_WORD = re.compile(
    rf"(?:{_GENERIC_NOUNS}|{_POSITIONS}|{_NUMBERS}|[a-z]|{_HONORIFICS.lower()}|"
    r"(?:1st|2nd|3rd|\d+th)|x|y|z)", re.I)

MIN_TOPIC_OVERLAP = 0.2
"""Least share of the starting situation's content words a scenario must keep (off-topic
below). Low on purpose: a scene that adds setting and dialogue keeps its key nouns and verbs
but may paraphrase the rest."""

_STOP = frozenset("""about above after again against along also among another around because
been before being below between both came come could does doing down during each either every
from have having here into just like made make many more most much must near never other over
same should since some such than that their them then there these they this those through
under until upon very were what when where which while with within without would your""".split())


def placeholder_left(text: str) -> bool:
    """True when `text` still holds a template placeholder."""
    return bool(PLACEHOLDER.search(text or ""))


def placeholder_person(description: str) -> bool:
    """True when a person's description is a stand-in: it holds a stand-in
    (`PLACEHOLDER_PERSON`: "[NAME]", "Speaker 2", "Mr. X", "Jane Doe"), or once determiners
    are dropped every word of it only says *that* someone is there: a position ("the
    first", "the former", "the latter"), a letter or a number ("Person A", "Group 3"), a
    generic noun ("individual", "someone", "the other person"). Judged by what the words
    are, so a new spelling of a stand-in ("the second participant", "Respondent #4") is
    caught like the ones seen; a description with one word that can name a group ("the
    first man", "Generation X", "Mr. Nguyen") passes."""
    text = (description or "").strip().strip('"').strip()
    if PLACEHOLDER_PERSON.search(text):
        return True
    words = re.findall(r"#?\w+\.?", text.lower().replace("-", " "))
    words = [w.rstrip(".") if not re.fullmatch(_HONORIFICS.lower(), w) else w for w in words]
    words = [w for w in words if w and w not in _DETERMINERS]
    return not words or all(_STAND_IN_WORD.fullmatch(w) for w in words)


def _holds_placeholder_person(text: str) -> bool:
    return bool(PLACEHOLDER_PERSON.search(text or ""))


def names(text: str, description: str) -> bool:
    """Whether `text` names the person `description` ("grandfather", "Japanese man"):
    the description occurs in it (any case), or every word of it of 3+ letters does."""
    low, desc = (text or "").lower(), description.lower().strip()
    if not desc:
        return False
    if desc in low:
        return True
    words = [w for w in re.findall(r"[a-z0-9'-]+", desc) if len(w) >= 3]
    found = set(re.findall(r"[a-z0-9'-]+", low))
    return bool(words) and all(w in found for w in words)


def _content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) >= 4 and w not in _STOP}


def topic_overlap(scenario: str, situation: str, people: Sequence[str] = ()) -> float:
    """Share of the situation's distinct content words (4+ letters, no stop words, not the
    words of the two `people`, which `names` checks) that the scenario also uses; 1.0 when
    the situation has none."""
    wanted = _content_words(situation) - set().union(*(_content_words(p) for p in people))
    if not wanted:
        return 1.0
    return len(wanted & _content_words(scenario)) / len(wanted)


def variant_failures(context: str, people: Sequence[str]) -> list[str]:
    """Rules one transformed variant breaks: its rewritten passage and its two new
    descriptions (`people`, in option order)."""
    out = []
    if not (context or "").strip():
        out.append("empty")
    if placeholder_left(context) or any(placeholder_left(p) for p in people):
        out.append("placeholder_left")
    if (any(placeholder_person(p) for p in people)
            or _holds_placeholder_person(context)):
        out.append("placeholder_person")
    if len({p.lower().strip() for p in people}) < len(people):
        out.append("same_groups")
    if context and not all(names(context, p) for p in people):
        out.append("group_not_named")
    return out


def scenario_failures(scenario: str | None, situation: str, people: Sequence[str]) -> list[str]:
    """Rules one generated scenario breaks, given the variant's passage it expands
    (`situation`) and the two people its answer options name."""
    if not (scenario or "").strip():
        return ["empty"]
    out = []
    if placeholder_left(scenario):
        out.append("placeholder_left")
    if _holds_placeholder_person(scenario):
        out.append("placeholder_person")
    if not all(names(scenario, p) for p in people):
        out.append("option_missing")
    if topic_overlap(scenario, situation, people) < MIN_TOPIC_OVERLAP:
        out.append("off_topic")
    return out


def question_failures(question: str) -> list[str]:
    """Rules a rephrased question breaks (besides differing from the original and naming no
    answer, which its parser checks)."""
    text = (question or "").strip().strip('"').strip()
    out = []
    if placeholder_left(text):
        out.append("placeholder_left")
    if _holds_placeholder_person(text):
        out.append("placeholder_person")
    if not text.endswith("?"):
        out.append("not_a_question")
    return out
