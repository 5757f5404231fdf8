"""Rule checks of the ``augmentation`` chain: cheap, deterministic tests that run before the
validators, so a broken generation is rejected and counted instead of passing as a success.

Each check returns the names of the rules a text breaks (empty: it passes). The names are
what the report counts (``tables/rule_rejections.csv``):

* ``placeholder_left``: the text still holds a template placeholder (``<new description>``,
  ``<replaces …>``, ``$person_a``): the generator echoed its prompt instead of filling it;
* ``placeholder_person``: a person is a stand-in, not a description of anyone: a bracketed
  word (``[NAME]``, ``[Person 1]``), a letter- or number-labelled generic person (``Group X``,
  ``Person B``, ``Individual 2``), a lone letter or slot name (``X``, ``NAME1``), or a word
  that names no group (``someone``, ``person``, ``the other group``); in a transform's two new
  descriptions or anywhere in its passage, scenario or rephrased question;
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

__all__ = ["PLACEHOLDER", "PLACEHOLDER_PERSON", "MIN_TOPIC_OVERLAP", "placeholder_left",
           "placeholder_person", "names", "topic_overlap",
           "variant_failures", "scenario_failures", "question_failures"]

PLACEHOLDER = re.compile(r"<[^<>\n]{0,80}>|\$\{?[A-Za-z_]\w*\}?|\{\{[^{}]*\}\}")
"""Angle-bracket fillers, ``$slot`` / ``${slot}`` and ``{{slot}}`` left in a generation."""
PLACEHOLDER_PERSON = re.compile(
    r"\[\s*[A-Za-z][\w .'-]{0,40}\]"                       # [NAME], [Person 1], [group]
    r"|\{\s*[A-Za-z_]\w*\s*\}"                               # {NAME}
    r"|\b(?:[Gg]roup|GROUP|[Pp]erson|PERSON|[Ii]ndividual|[Cc]haracter|[Dd]emographic|"
    r"[Ss]ubject|[Pp]arty|[Nn]ame|NAME)[ _-]?(?:[A-HJ-Z]|\d{1,2})\b"  # Group X, Person 2, NAME1
    r"|\b(?:NAME|PERSON|GROUP|DESCRIPTION)\b")                   # a slot name in capitals
"""A stand-in person written into a text. "I" is not a label ("the person I met")."""
_GENERIC_PEOPLE = frozenset("""x y z a b person people someone somebody anyone individual
group character other another name description demographic""".split())
_ARTICLES = ("the ", "a ", "an ", "one ", "another ", "other ", "some ")

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
    """True when a person's description is a stand-in (`PLACEHOLDER_PERSON`), or names no
    group at all once articles are dropped ("someone", "the other person", "X")."""
    text = (description or "").strip().strip('"').strip()
    if PLACEHOLDER_PERSON.search(text):
        return True
    low = text.lower().rstrip(".")
    for article in _ARTICLES:
        low = low.removeprefix(article)
    words = low.split()
    return not words or all(w in _GENERIC_PEOPLE for w in words)


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
