"""Prompt templates as data: TOML files with declared slots, looked up by id.

A template file holds ``slots`` (the names it fills), ``system`` and ``user`` texts using
``$slot`` placeholders, and an optional ``description``. A template for a model in a dialogue
may name one slot as its ``conversation``: that slot's value, the earlier turns as a list of
``{"role": "user"|"assistant", "content": ...}`` messages, is sent as native chat turns
between the system text and the user text (the latest user message), never pasted into a
text. Its id is its path below a prompt root
without the suffix: ``amplification/prediction.toml`` is ``amplification/prediction`` (variant
``default``) and ``amplification/prediction.terse.toml`` is ``amplification/prediction@terse``.

A slot that carries a text under judgement is *quoted*: every slot written inside a
``<quoted-...>`` block of the template, and any slot the file lists under ``quoted``. Its value
is escaped when rendered (`escape_quoted`), so a judged text can neither close the block it
stands in nor open another one, nor write a verdict marker: the stored prompt shows the
escaped text, exactly what the model read.

Users swap a node's prompt by id, by a file path, or by an overrides directory with the same
layout, which shadows the packaged files. Slot mistakes fail at load time, naming the template
and the slot, so a typo never reaches a model.
"""

from __future__ import annotations

import hashlib
import re
import string
import tomllib
import unicodedata
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from biaslab.errors import UserError

__all__ = ["PromptTemplate", "PromptRegistry", "PACKAGE_PROMPTS", "Message", "escape_quoted"]

PACKAGE_PROMPTS = Path(__file__).parent
Message = dict[str, str]  # {"role": "system"|"user"|"assistant", "content": str}

_TAG_OPENER = re.compile(r"[<\uFF1C\uFE64\u2039\u276C\u276E\u27E8\u3008\u2329]")
"""A ``<`` or a look-alike (fullwidth, small, angle brackets and quotation marks): it opens a
tag-like token (``<quoted-reply>``, ``</quoted-reply>``, ``<verdict-...>``, ``＜/quoted…``)
when a name or ``/`` follows (`_opens_tag`)."""
_BLOCK = re.compile(r"<(quoted-[\w-]+)>(.*?)</\1\s*>", re.S | re.I)


def escape_quoted(text: str) -> str:
    """A judged text made safe to stand inside a ``<quoted-...>`` block: every character that
    could open a tag (``<`` and its look-alikes, when a name or ``/`` follows) is written
    ``&lt;``, so no reply can close its block, open another, or write a verdict marker. The
    text is otherwise unchanged: ``a < b`` and ``3<4`` stay as they are.

    Invisible format characters (Unicode category Cf: zero-width space U+200B, word joiner
    U+2060, soft hyphen, bidi marks...) between the ``<`` and the name are looked through: a
    model that ignores them reads ``<\u200b/quoted-answer>`` as a closing tag."""
    parts, last = [], 0
    for match in _TAG_OPENER.finditer(text):
        if _opens_tag(text, match.end()):
            parts += [text[last:match.start()], "&lt;"]
            last = match.end()
    return "".join(parts) + text[last:] if parts else text


def _opens_tag(text: str, at: int) -> bool:
    """Whether what follows an opener at `at` makes it a tag: a letter, or ``/`` after spaces,
    format characters (Cf) between them not counting."""
    spaced = False
    for char in text[at:at + 64]:
        if unicodedata.category(char) == "Cf":
            continue
        if char.isspace():
            spaced = True
            continue
        return char == "/" or (not spaced and (char.isalpha() or char == "_"))
    return False


def _slots_in_blocks(*texts: str) -> set[str]:
    """The slots written inside a ``<quoted-...>`` block of the template's texts."""
    return {slot for text in texts for match in _BLOCK.finditer(text)
            for slot in _used_slots(match.group(2), "quoted block")}


@dataclass(frozen=True)
class PromptTemplate:
    """One prompt: a system text and a user text with named ``$slots``.

    Attributes:
        id: ``protocol/name`` without the variant.
        variant: ``default`` or the variant name from the file name.
        slots: the slot names the texts use; exactly these must be filled.
        system: system message text (may be empty).
        user: user message text.
        source: where the template was read from, for error messages.
    """

    id: str
    variant: str
    slots: tuple[str, ...]
    system: str
    user: str
    source: str = ""
    description: str = ""
    labels: tuple[str, ...] = ()
    """For judge prompts: the labels the answer must choose from."""
    conversation: str = ""
    """The slot whose value (earlier turns as user/assistant messages) is sent as native chat
    turns after the system message and before the user message; "" for none."""
    quoted: tuple[str, ...] = ()
    """The slots whose values are judged texts, escaped when rendered (`escape_quoted`)."""
    position: str = ""
    """For mitigation templates: where their text goes unless the spec says otherwise (e.g.
    ``after-answer`` for a self-check, asked after the node's answer); "" for the default."""

    @property
    def ref(self) -> str:
        """The id with its variant, as recorded on every call."""
        return self.id if self.variant == "default" else f"{self.id}@{self.variant}"

    @cached_property
    def origin(self) -> str:
        """The file it came from, as recorded on calls: ``biaslab:amplification/predict.toml``
        for a packaged template (no machine-specific path), else the file's absolute path."""
        if not self.source:
            return ""
        path = Path(self.source).resolve()
        if path.is_relative_to(PACKAGE_PROMPTS.resolve()):
            return f"biaslab:{path.relative_to(PACKAGE_PROMPTS.resolve()).as_posix()}"
        return str(path)

    @cached_property
    def content_hash(self) -> str:
        """Short sha256 of what the model sees; two runs with equal hashes used the same text."""
        h = hashlib.sha256()
        parts = [self.system, "\x00", self.user, "\x00", ",".join(self.slots)]
        if self.conversation:  # (templates without one keep their hash)
            parts += ["\x00", f"conversation={self.conversation}"]
        if self.position:  # likewise
            parts += ["\x00", f"position={self.position}"]
        for part in parts:
            h.update(part.encode())
        return h.hexdigest()[:16]

    def render(self, values: Mapping[str, object]) -> list[Message]:
        """Fill the slots. Values the template does not declare are ignored (nodes offer more
        slots than a terse variant may use); a declared slot without a value is an error."""
        missing = [s for s in self.slots if s not in values]
        if missing:
            raise UserError(f"prompt {self.ref}: no value for slot '{missing[0]}' "
                            f"(the node provides {sorted(values)})")
        filled = {s: escape_quoted(str(values[s])) if s in self.quoted else str(values[s])
                  for s in self.slots if s != self.conversation}
        system, user = self._templates
        messages: list[Message] = []
        if system is not None:
            messages.append({"role": "system", "content": system.fill(filled)})
        if self.conversation:
            messages.extend(self._turns(values[self.conversation]))
        messages.append({"role": "user", "content": user.fill(filled)})
        return messages

    def _turns(self, turns: object) -> list[Message]:
        if not isinstance(turns, (list, tuple)) or not all(
                isinstance(m, Mapping) and m.get("role") in ("user", "assistant")
                and isinstance(m.get("content"), str) for m in turns):
            raise TypeError(f"prompt {self.ref}: slot '{self.conversation}' must be a list of "
                            "{'role': 'user'|'assistant', 'content': str} messages")
        return [{"role": m["role"], "content": m["content"]} for m in turns]

    @cached_property
    def _templates(self) -> tuple[_Text | None, _Text]:
        return (_Text(self.system) if self.system.strip() else None, _Text(self.user))

    def check_slots(self, offered: Iterable[str], node: str) -> None:
        """Fail when the template needs a slot the node cannot fill."""
        offered = set(offered)
        for slot in self.slots:
            if slot not in offered:
                raise UserError(f"prompt {self.ref} ({self.source}) declares slot '{slot}', "
                                f"but node '{node}' provides only {sorted(offered)}")


class _Text:
    """One template text cut once into literal pieces and slot names, so that filling it is a
    join (`string.Template.substitute` runs a regular expression and a callback per call:
    a tenth of a one-call cell's CPU went to rendering). `fill` gives what `substitute` gives;
    a text this cut does not cover (a malformed placeholder, a slot without a value) is left
    to `substitute`, which raises its own error."""

    def __init__(self, text: str):
        self.template = string.Template(text)
        pieces: list[tuple[bool, str]] | None = []
        last = 0
        for match in self.template.pattern.finditer(text):
            pieces.append((False, text[last:match.start()]))
            name = match.group("named") or match.group("braced")
            if match.group("escaped") is not None:
                pieces.append((False, "$"))
            elif name:
                pieces.append((True, name))
            else:
                pieces = None
                break
            last = match.end()
        if pieces is not None:
            pieces.append((False, text[last:]))
        self.pieces = pieces
        self.names = {piece for is_slot, piece in pieces or () if is_slot}

    def fill(self, values: Mapping[str, str]) -> str:
        if self.pieces is None or not self.names <= values.keys():
            return self.template.substitute(values)
        return "".join([values[piece] if is_slot else piece for is_slot, piece in self.pieces])


def _used_slots(text: str, where: str) -> set[str]:
    tpl = string.Template(text)
    if not tpl.is_valid():
        raise UserError(f"prompt {where}: malformed placeholder (write a literal $ as $$)")
    return set(tpl.get_identifiers())


def load_template(path: Path, template_id: str, variant: str) -> PromptTemplate:
    """Read and validate one template file."""
    where = f"{template_id}@{variant} ({path})"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"prompt {where}: cannot read file: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"prompt {where}: not valid TOML: {exc}") from None
    except RecursionError:
        raise UserError(f"prompt {where}: nested too deeply to be a prompt template") from None
    unknown_keys = set(data) - {"slots", "system", "user", "description", "labels",
                                "conversation", "position", "quoted"}
    if unknown_keys:
        raise UserError(f"prompt {where}: unknown key '{sorted(unknown_keys)[0]}' "
                        "(allowed: slots, system, user, description, labels, conversation, "
                        "position, quoted)")
    if not isinstance(data.get("position", ""), str):
        raise UserError(f"prompt {where}: 'position' must be a string such as 'after-answer'")
    labels = data.get("labels", [])
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise UserError(f"prompt {where}: 'labels' must be a list of strings")
    if not isinstance(data.get("user"), str) or not data["user"].strip():
        raise UserError(f"prompt {where}: needs a non-empty 'user' text")
    slots = data.get("slots", [])
    if not isinstance(slots, list) or not all(isinstance(s, str) for s in slots):
        raise UserError(f"prompt {where}: 'slots' must be a list of names")
    system = data.get("system", "")
    used = _used_slots(system, where) | _used_slots(data["user"], where)
    conversation = data.get("conversation", "")
    if conversation:
        if not isinstance(conversation, str) or conversation not in slots:
            raise UserError(f"prompt {where}: 'conversation' must name one of its slots "
                            f"{slots}, got {conversation!r}")
        if conversation in used:
            raise UserError(f"prompt {where}: the conversation slot '{conversation}' is sent "
                            f"as chat turns; do not also write ${conversation} in a text")
        used = used | {conversation}
    for slot in sorted(used - set(slots)):
        raise UserError(f"prompt {where}: uses slot '${slot}' that is not declared in 'slots'")
    for slot in sorted(set(slots) - used):
        raise UserError(f"prompt {where}: declares slot '{slot}' but never uses it")
    quoted = data.get("quoted", [])
    if not isinstance(quoted, list) or not all(isinstance(q, str) and q in slots and
                                               q != conversation for q in quoted):
        raise UserError(f"prompt {where}: 'quoted' must list some of its text slots {slots}")
    quoted = sorted(set(quoted) | _slots_in_blocks(system, data["user"]))
    return PromptTemplate(id=template_id, variant=variant, slots=tuple(slots), system=system,
                          user=data["user"], source=str(path),
                          description=data.get("description", ""), labels=tuple(labels),
                          conversation=conversation, position=data.get("position", ""),
                          quoted=tuple(quoted))


def _parse_ref(ref: str) -> tuple[str, str]:
    template_id, _, variant = ref.partition("@")
    return template_id.strip("/"), variant or "default"


class PromptRegistry:
    """Finds templates by id in a list of roots; earlier roots shadow later ones.

    Args:
        overrides: directories laid out like ``biaslab/prompts`` whose files replace or add
            templates. The packaged prompts are always searched last.
    """

    def __init__(self, overrides: Sequence[str | Path] = ()):
        self.roots: list[Path] = []
        for root in overrides:
            path = Path(root)
            if not path.is_dir():
                raise UserError(f"prompt overrides directory not found: {path}")
            for entry in path.rglob("*.toml"):  # else it would shadow nothing, in silence
                if entry.is_dir():
                    raise UserError(f"prompt override {entry} is a directory, not a template "
                                    "file")
            self.roots.append(path)
        self.roots.append(PACKAGE_PROMPTS)
        self._cache: dict[str, PromptTemplate] = {}

    def get(self, ref: str) -> PromptTemplate:
        """Resolve ``id``, ``id@variant`` or a path to a ``.toml`` file."""
        if ref in self._cache:
            return self._cache[ref]
        if ref.endswith(".toml"):
            path = Path(ref)
            if not path.is_file():
                raise UserError(f"prompt file not found: {ref}")
            template = load_template(path, f"file:{path.stem}", "default")
        else:
            template_id, variant = _parse_ref(ref)
            filename = template_id + (".toml" if variant == "default" else f".{variant}.toml")
            for root in self.roots:
                path = root / filename
                if path.is_file():
                    template = load_template(path, template_id, variant)
                    break
            else:
                known = ", ".join(t.ref for t in self.list() if t.id.split("/")[0]
                                  == template_id.split("/")[0]) or "none"
                raise UserError(f"unknown prompt '{ref}' (known in that group: {known})")
        self._cache[ref] = template
        return template

    def list(self) -> list[PromptTemplate]:
        """Every template visible through the roots, overrides first, deduplicated by ref."""
        seen: dict[str, PromptTemplate] = {}
        for root in self.roots:
            for path in sorted(root.rglob("*.toml")):
                rel = path.relative_to(root).with_suffix("")
                name, _, variant = rel.name.partition(".")
                template_id = str(rel.parent / name)
                ref = template_id if not variant else f"{template_id}@{variant}"
                if ref not in seen:
                    seen[ref] = load_template(path, template_id, variant or "default")
        return sorted(seen.values(), key=lambda t: t.ref)
