"""Group-term swaps on hand-written sentences: whole words, both directions at once, case kept,
longest phrase first; and the lexicon file's errors as one line."""

from __future__ import annotations

import pytest

from biaslab.errors import UserError
from biaslab.prompts.group_swap import DEFAULT_LEXICON, Lexicon, load_lexicon, swap_terms

GENDER = [("he", "she"), ("his", "her"), ("him", "her"), ("men", "women"), ("man", "woman")]


@pytest.mark.parametrize("text, swapped", [
    # both directions in one pass: a replace chain would give "she ... she"
    ("he told her", "she told his"),
    ("Men and women differ less than people think.", "Women and men differ less than people "
                                                     "think."),
    # case of the replaced word: capitalised, all capitals, lower case
    ("He asked; HE insisted; he left.", "She asked; SHE insisted; she left."),
    # whole words only: no swap inside 'theme', 'mention', 'manager', 'Shell'
    ("The theme of the manager's mention is Shell.", "The theme of the manager's mention is "
                                                     "Shell."),
    # punctuation around a word does not hide it
    ("(men), 'women'; man.", "(women), 'men'; woman."),
    # 'her' is in two pairs: its first pair (his/her) decides
    ("She gave him her book.", "He gave her his book."),
])
def test_swap_on_hand_written_sentences(text, swapped):
    assert swap_terms(text, GENDER) == swapped


def test_longest_phrase_first_and_hyphenated_words_kept_whole():
    lexicon = Lexicon("t", (("Black people", "white people"),
                            ("disabled people", "non-disabled people"), ("people", "persons")))
    text, n = lexicon.swap("Black people and non-disabled people, like disabled  people.")
    # 'non-disabled people' is matched whole (not its inner 'disabled people'); the two-space
    # phrase still counts as the phrase
    assert text == "White people and disabled people, like non-disabled people."
    assert n == 3


def test_swap_counts_terms_and_walks_nested_slot_values():
    lexicon = Lexicon("t", tuple(GENDER))
    value, n = lexicon.swap_value({"query": "Is he right?", "history": ["men talk", 3, None],
                                   "n": 2})
    assert value == {"query": "Is she right?", "history": ["women talk", 3, None], "n": 2}
    assert n == 2
    assert lexicon.swap("nothing to swap here") == ("nothing to swap here", 0)


def test_packaged_lexicon_adds_the_protocols_own_group_names():
    shared = load_lexicon()
    multiturn = load_lexicon(protocol="multiturn")
    assert shared.name == "group_terms" and DEFAULT_LEXICON.is_file()
    assert len(multiturn.pairs) > len(shared.pairs)
    assert multiturn.swap("Muslims and women")[0] == "Christians and men"
    assert shared.swap("Muslims and women")[0] == "Muslims and men"
    assert shared.content_hash != multiturn.content_hash


def test_a_users_lexicon_file(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('pairs = [["cats", "dogs"]]\n[protocols.roleplay]\npairs = [["red", "blue"]]\n')
    assert load_lexicon(path).swap("cats like red")[0] == "dogs like red"
    assert load_lexicon(path, "roleplay").swap("cats like red")[0] == "dogs like blue"
    assert load_lexicon(path).name == "mine"
    # a protocol's own pair wins over a shared one; shared = false drops the shared pairs
    path.write_text('pairs = [["cats", "dogs"]]\n[protocols.p]\npairs = [["cats", "mice"]]\n'
                    '[protocols.q]\nshared = false\npairs = [["red", "blue"]]\n')
    assert load_lexicon(path, "p").swap("cats and dogs")[0] == "mice and cats"
    assert load_lexicon(path, "q").swap("cats in red")[0] == "cats in blue"


@pytest.mark.parametrize("content, message", [
    ("pairs = [[\"he\"]]", r"pairs\[0\] must be two non-empty terms"),
    ("pairs = [[\"he\", \"HE\"]]", "swaps 'he' with itself"),
    ("pairs = 3", "'pairs' must be a list"),
    ("name = \"x\"", "no term pairs"),
    ("pairs = [[", "not a TOML file"),
])
def test_bad_lexicon_files_are_one_line(tmp_path, content, message):
    path = tmp_path / "bad.toml"
    path.write_text(content)
    with pytest.raises(UserError, match=message):
        load_lexicon(path)
    with pytest.raises(UserError, match="file not found"):
        load_lexicon(tmp_path / "missing.toml")
