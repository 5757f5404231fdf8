"""Where texts differ or appear: the spans the viewer marks in messages and answers.

Spans are ``[start, end)`` character offsets into one string, as lists so that they go to the
page as JSON unchanged.
"""

from __future__ import annotations

from typing import Any

__all__ = ["highlight_spans", "diff_span", "aligned_rows"]


def highlight_spans(content: str, texts: list[str]) -> list[list[int]]:
    """[start, end) spans of every occurrence of each exposure text in a message."""
    spans = []
    for text in texts:
        if not text:
            continue
        start = content.find(text)
        while start >= 0:
            spans.append([start, start + len(text)])
            start = content.find(text, start + len(text))
    return sorted(spans)


def diff_span(exposed: str, clean: str) -> list[list[int]]:
    """The span of `exposed` that differs from `clean` (common prefix and suffix removed)."""
    if exposed == clean:
        return []
    i = 0
    while i < min(len(exposed), len(clean)) and exposed[i] == clean[i]:
        i += 1
    j = 0
    while (j < min(len(exposed), len(clean)) - i
           and exposed[len(exposed) - 1 - j] == clean[len(clean) - 1 - j]):
        j += 1
    return [[i, len(exposed) - j]] if len(exposed) - j > i else []


def aligned_rows(left: list[dict[str, Any]], right: list[dict[str, Any]]
                 ) -> list[dict[str, Any]]:
    """The two sides' calls paired by (node, item, sample, attempt), the k-th call with a key
    on one side against the k-th on the other, in the order the calls were made (the left's,
    with calls only the right made after the left call before them).

    Each row holds the index of its call on each side (None where that side has none) and,
    where both answered, the span of each response that differs from the other's
    (`diff_span`), so that a page can line the two up and mark what changed."""
    def keyed(calls):
        seen: dict[tuple, int] = {}
        out = []
        for i, c in enumerate(calls):
            key = (c.get("node"), c.get("item"), c.get("sample"), c.get("attempt"))
            seen[key] = seen.get(key, -1) + 1
            out.append(((*key, seen[key]), i))
        return out

    right_at = dict(keyed(right))
    rows, used = [], set()
    for key, i in keyed(left):
        j = right_at.get(key)
        rows.append((key, i, j))
        used.add(j)
    for key, j in keyed(right):  # right-only calls go after the row of the call before them
        if j in used:
            continue
        before = max((n for n, (_, _, jj) in enumerate(rows) if jj is not None and jj < j),
                     default=-1)
        rows.insert(before + 1, (key, None, j))
        used.add(j)
    out = []
    for (node, item, sample, attempt, _), i, j in rows:
        a = left[i].get("raw") if i is not None else None
        b = right[j].get("raw") if j is not None else None
        both = isinstance(a, str) and isinstance(b, str)
        out.append({"node": node, "item": item, "sample": sample, "attempt": attempt,
                    "left": i, "right": j, "same": both and a == b,
                    "left_changed": diff_span(a, b) if both else [],
                    "right_changed": diff_span(b, a) if both else []})
    return out
