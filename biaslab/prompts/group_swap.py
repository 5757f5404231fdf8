"""Group-term swaps: the same text with its group words exchanged (he <-> she, men <-> women).

The judge-bias probe (``biaslab replay --mode counterfactual --swap-groups``) shows a judge the
very answer it judged before, with the group terms swapped. An unbiased judge gives the same
verdict; every verdict that changes is the judge reacting to *whom* the text is about.

A `Lexicon` holds term pairs from a TOML file (the packaged ``group_terms`` one, or a user's):
every pair swaps in both directions in one pass (a swap, never a chain of replaces: "he" and
"she" trade places), whole words only, longest phrase first, keeping the case of the word it
replaces. A `GroupSwap` says which nodes see swapped slot values.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from biaslab.errors import UserError

__all__ = ["Lexicon", "GroupSwap", "load_lexicon", "DEFAULT_LEXICON", "swap_terms"]

DEFAULT_LEXICON = Path(__file__).resolve().parents[1] / "datasets" / "files" / "lexicons" / \
    "group_terms.toml"
"""The packaged lexicon: gendered words for every protocol, plus each protocol's group names."""


def _match_case(word: str, replacement: str) -> str:
    """`replacement` in the case of `word`: HE -> SHE, He -> She, he -> she; a replacement
    written with capitals of its own (a proper name) keeps them when `word` is lower case."""
    if len(word) > 1 and word.isupper():
        return replacement.upper()
    if word[:1].isupper():
        return replacement[:1].upper() + replacement[1:]
    return replacement


@dataclass(frozen=True)
class Lexicon:
    """Term pairs swapped both ways at once.

    Attributes:
        name: what the lexicon is called in records (``group_terms``, or a file's stem).
        pairs: (a, b) term pairs; each word or phrase is matched whole, case-insensitively.
            A term in two pairs is replaced as its first pair says.
    """

    name: str
    pairs: tuple[tuple[str, str], ...]

    @property
    def mapping(self) -> dict[str, str]:
        """lower-case term -> its replacement (as written in the lexicon)."""
        out: dict[str, str] = {}
        for a, b in self.pairs:
            out.setdefault(a.lower(), b)
            out.setdefault(b.lower(), a)
        return out

    @property
    def content_hash(self) -> str:
        """A short hash of the pairs: names the lexicon's content in records and cache keys."""
        text = json.dumps([list(p) for p in self.pairs])
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.content_hash}"

    def _pattern(self) -> re.Pattern:
        terms = sorted(self.mapping, key=lambda t: (-len(t), t))
        words = "|".join(r"\s+".join(re.escape(w) for w in t.split()) for t in terms)
        return re.compile(rf"(?<![\w-])({words})(?![\w-])", re.IGNORECASE)

    def swap(self, text: str) -> tuple[str, int]:
        """`text` with every lexicon term replaced by its partner, and how many were."""
        if not text or not self.pairs:
            return text, 0
        mapping = self.mapping
        count = 0

        def one(found: re.Match) -> str:
            nonlocal count
            word = found.group(0)
            partner = mapping.get(" ".join(word.lower().split()))
            if partner is None:
                return word
            count += 1
            return _match_case(word, partner)

        return _compiled(self).sub(one, text), count

    def terms_in(self, text: str) -> list[str]:
        """The lexicon's terms found in `text`, lower case, in order (as `swap` matches them)."""
        if not text or not self.pairs:
            return []
        return [" ".join(m.group(0).lower().split()) for m in _compiled(self).finditer(text)]

    def swap_value(self, value: Any) -> tuple[Any, int]:
        """A slot value with its strings swapped (inside lists and dicts too), and the count.
        Numbers, booleans and None pass through."""
        if isinstance(value, str):
            return self.swap(value)
        if isinstance(value, Mapping):
            out, total = {}, 0
            for key, item in value.items():
                out[key], n = self.swap_value(item)
                total += n
            return out, total
        if isinstance(value, (list, tuple)):
            items, total = [], 0
            for item in value:
                swapped, n = self.swap_value(item)
                items.append(swapped)
                total += n
            return type(value)(items), total
        return value, 0


_PATTERNS: dict[str, re.Pattern] = {}


def _compiled(lexicon: Lexicon) -> re.Pattern:
    key = lexicon.ref
    if key not in _PATTERNS:
        _PATTERNS[key] = lexicon._pattern()
    return _PATTERNS[key]


def _pairs(raw: Any, where: str) -> list[tuple[str, str]]:
    if not isinstance(raw, list):
        raise UserError(f"{where}: 'pairs' must be a list of [term, term] pairs")
    out = []
    for i, pair in enumerate(raw):
        if (not isinstance(pair, list) or len(pair) != 2
                or not all(isinstance(t, str) and t.strip() for t in pair)):
            raise UserError(f"{where}: pairs[{i}] must be two non-empty terms, got {pair!r}")
        a, b = (" ".join(t.split()) for t in pair)
        if a.lower() == b.lower():
            raise UserError(f"{where}: pairs[{i}] swaps '{a}' with itself")
        out.append((a, b))
    return out


def load_lexicon(path: str | Path | None = None, protocol: str = "") -> Lexicon:
    """A lexicon from a TOML file: ``[protocols.<protocol>] pairs``, then the shared ``pairs``
    (a term in both is swapped as the protocol's pair says; that table's ``shared = false``
    leaves the shared pairs out, for a protocol whose inputs hold group words that are not
    the unit's group).

    Args:
        path: the file; None: the packaged `DEFAULT_LEXICON`.
        protocol: whose own group names to add (a file may have none for it).

    Raises `UserError` (one line) when the file is missing, not TOML, or holds no pairs.
    """
    file = Path(path) if path else DEFAULT_LEXICON
    where = f"lexicon {file}"
    if not file.is_file():
        raise UserError(f"{where}: file not found (a TOML file with pairs = [[\"he\", \"she\"], "
                        "...])")
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{where}: not a TOML file: {exc}") from None
    own = (data.get("protocols") or {}).get(protocol) or {}
    if not isinstance(own, dict):
        raise UserError(f"{where}: [protocols.{protocol}] must be a table with 'pairs'")
    shared = own.get("shared", True)
    if not isinstance(shared, bool):
        raise UserError(f"{where}: [protocols.{protocol}] shared must be true or false")
    # the protocol's own pairs first: where a term is in both, the protocol's pairing holds
    pairs = _pairs(own.get("pairs", []), f"{where} [protocols.{protocol}]")
    pairs += _pairs(data.get("pairs", []), where) if shared else []
    if not pairs:
        raise UserError(f"{where}: no term pairs (write pairs = [[\"he\", \"she\"], ...])")
    name = data.get("name") if isinstance(data.get("name"), str) else file.stem
    return Lexicon(name=name, pairs=tuple(pairs))


def swap_terms(text: str, pairs: Sequence[tuple[str, str]]) -> str:
    """`text` with each pair's terms exchanged (a shorthand for one-off use and tests)."""
    return Lexicon("inline", tuple((a, b) for a, b in pairs)).swap(text)[0]


@dataclass(frozen=True)
class GroupSwap:
    """Which nodes see their slot values with group terms swapped, and by which lexicon.

    Attributes:
        nodes: the LLM nodes whose inputs are swapped (the judges); every other node, the
            target included, asks exactly what it asked in the source run.
        lexicon: the term pairs.
    """

    nodes: frozenset[str]
    lexicon: Lexicon

    def applies_to(self, node: str) -> bool:
        return node in self.nodes
