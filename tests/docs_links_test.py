#!/usr/bin/env python3
"""Every relative link in README.md and docs/*.md leads somewhere.

A link to a file must name a file or folder of the repository, and a `#anchor` (in the same
page or another Markdown page) must be a heading there, slugged as GitHub slugs headings.
Links that leave the repository (`../` past its root, or a folder such as ../shared that
users do not have) fail too. Absolute URLs (http:, https:, mailto:) are not checked: no
network in CI.

Usage: docs_links_test.py [REPO_ROOT]   (default: this file's parent's parent)
"""
import os
import re
import sys

# [text](target) and ![alt](target); the target ends at whitespace or ')'. Inline code is
# removed first, so `a[0](b)` in code is not a link.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def slug(heading):
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to
    hyphens (hyphens and underscores kept)."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def prose_lines(path, keep_code=False):
    """(line number, text) outside fenced code blocks; inline code removed unless
    `keep_code` (a heading's code is part of its anchor)."""
    fenced = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if not fenced:
                yield number, line if keep_code else re.sub(r"`[^`]*`", "", line)


def anchors(path):
    found, counts = set(), {}
    for _, line in prose_lines(path, keep_code=True):
        m = HEADING.match(line.rstrip("\n"))
        if not m:
            continue
        base = slug(m.group(2))
        n = counts.get(base, 0)
        counts[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def check(root):
    pages = [os.path.join(root, "README.md")]
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        pages += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    problems = []
    checked = 0
    for page in pages:
        if not os.path.exists(page):
            problems.append(f"{os.path.relpath(page, root)}: missing")
            continue
        for number, line in prose_lines(page):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # http:, https:, mailto:
                checked += 1
                where = f"{os.path.relpath(page, root)}:{number}: '{target}'"
                file_part, _, anchor = target.partition("#")
                dest = page if not file_part else os.path.normpath(
                    os.path.join(os.path.dirname(page), file_part))
                if os.path.relpath(dest, root).startswith(".."):
                    problems.append(f"{where} leaves the repository")
                    continue
                if not os.path.exists(dest):
                    problems.append(f"{where}: no such file {os.path.relpath(dest, root)}")
                    continue
                if anchor and dest.endswith(".md") and anchor not in anchors(dest):
                    problems.append(f"{where}: no heading #{anchor} in "
                                    f"{os.path.relpath(dest, root)}")
    return checked, problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))
    checked, problems = check(root)
    for p in problems:
        print(p)
    print(f"{checked} relative links checked, {len(problems)} broken")
    return 1 if problems or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
