"""Reading the code blocks of a Markdown file: fences, their language and the
doc-check marker on the line before them, and indented code blocks (which the
checker refuses: a fence names its language, so it can be checked)."""

import re
from dataclasses import dataclass, field

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[^\s`]*)")
MARKER = re.compile(r"^\s*<!--\s*doc-check:\s*(?P<word>[\w-]+)\s*(?:\((?P<reason>.*)\))?\s*-->\s*$")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s")

# The words a marker may carry.
MARKER_WORDS = {"skip", "compile-only"}


@dataclass
class Block:
    path: str
    line: int  # 1-based line of the opening fence
    lang: str
    lines: list = field(default_factory=list)
    marker: str = ""  # "", "skip", "compile-only"
    reason: str = ""
    problem: str = ""  # set when the block or its marker is malformed

    @property
    def where(self):
        return f"{self.path}:{self.line}"

    @property
    def text(self):
        return "\n".join(self.lines) + "\n"


def _marker_of(previous_line, block):
    """Reads a `<!-- doc-check: WORD (reason) -->` marker; a malformed one is a problem."""
    if previous_line is None or "doc-check" not in previous_line:
        return
    m = MARKER.match(previous_line)
    if not m or m.group("word") not in MARKER_WORDS:
        block.problem = f"unreadable doc-check marker: {previous_line.strip()}"
        return
    block.marker = m.group("word")
    block.reason = (m.group("reason") or "").strip()
    if block.marker == "skip" and not block.reason:
        block.problem = "a skip marker needs a reason: <!-- doc-check: skip (why) -->"


def read_blocks(path, text):
    """Every fenced block of a Markdown text, in order; unclosed fences are problems."""
    blocks = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = len(m.group("indent")), m.group("fence")
        block = Block(path, i + 1, m.group("lang").lower())
        _marker_of(lines[i - 1] if i > 0 else None, block)
        closer = re.compile(r"^ *" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$")
        j = i + 1
        while j < len(lines) and not closer.match(lines[j]):
            # Content is indented like its fence (inside a list item): take that off.
            line = lines[j]
            strip = min(indent, len(line) - len(line.lstrip(" ")))
            block.lines.append(line[strip:])
            j += 1
        if j == len(lines):
            block.problem = "the fence is never closed"
        blocks.append(block)
        i = j + 1
    return blocks


def indented_code_blocks(text):
    """Line numbers where an indented (4-space) code block starts outside fences and lists.

    Markdown makes a code block of any paragraph indented by four spaces after a blank
    line, unless it continues a list item; such a block has no language, so the checker
    cannot know how to run it."""
    found = []
    in_fence = None
    in_list = False
    previous = ""
    for number, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if m and (in_fence is None or line.strip().startswith(in_fence)):
            in_fence = None if in_fence else m.group("fence")[0] * 3
            previous = line
            continue
        if in_fence:
            continue
        if LIST_ITEM.match(line):
            in_list = True
        elif line.strip() and not line.startswith(" "):
            in_list = False
        if (line.startswith("    ") or line.startswith("\t")) and not previous.strip() and not in_list:
            if line.strip():
                found.append(number)
        previous = line
    return found
