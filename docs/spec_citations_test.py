"""Every citation of the specification names something docs/spec.md has.

Run by //:spec_citations_test (docs/spec_citations_test.sh) from its runfiles:
the files it checks are the `spec_cited_files` filegroups of every package
(*.cc, *.h, *.py, *.sh, *.md, BUILD) plus the root's README.md and docs/.

A citation is a section sign followed by a number, N or N.M, with an optional
part letter (5.4a or 5.4(a)); in this repository the sign always points into
the specification. Also checked: "SPEC N.M" without the sign, and the second
end of a range ("4.7-4.8"). docs/spec.md must hold each cited section
("## N. Title"), item ("**N.M** ..." at the start of a line) and part
("**(a)**" inside the item), and keep every item of the shared specification
it was written from (SECTION_ITEMS below; items may be added, never removed).

Coverage: the packages received must be exactly EXPECTED_PACKAGES, and when the
runfiles lead back to the source tree, every file there that cites the
specification must have been received, so a new package whose BUILD has no
filegroup in the test's data fails here instead of escaping the check.
"""

import os
import re
import sys

SIGN = "\u00a7"
SUFFIXES = (".cc", ".h", ".py", ".sh", ".md")
# Directory names never searched in the source tree: Bazel's outputs, code that
# is not the project's, scratch work, and what pip leaves in python/.
SKIP_DIRS = {"third_party", "scratch", ".git", "build", "__pycache__", ".gpu",
             ".gl", ".whl"}
# The packages whose spec_cited_files the test receives ("" is the root).
EXPECTED_PACKAGES = {
    "", "backends/counting", "backends/cuda", "backends/sim", "bench",
    "engine", "engine/budget", "engine/core", "engine/layer",
    "engine/pipeline", "engine/plan", "engine/policy",
    "examples/outside_suite", "fuzz", "props", "python", "testing",
    "timeline", "tools", "workload",
}
# Items per section of the shared specification (numbered 1..count) and the
# lettered parts of its items.
SECTION_ITEMS = {1: 4, 2: 5, 3: 6, 4: 8, 5: 8, 6: 7, 7: 8, 8: 0}
ITEM_PARTS = {(5, 4): "abc", (5, 8): "abcdefgh"}

NUM = r"(\d+)(?:\.(\d+))?(?:([a-z])(?![A-Za-z0-9])|\(([a-z])\))?"
RANGE_END = r"\s*[-\u2013]\s*(\d+)\.(\d+)"
CITATION = re.compile(SIGN + r"\s*" + NUM + "(?:" + RANGE_END + ")?")
PLAIN = re.compile(r"\bSPEC\s+(\d+)\.(\d+)(?:([a-z])(?![A-Za-z0-9])|\(([a-z])\))?")


def in_scope(name):
    return name == "BUILD" or name.endswith(SUFFIXES)


def skipped_dir(name):
    return (name in SKIP_DIRS or name.startswith("bazel-")
            or name.endswith(".egg-info"))


def files_under(root, prune):
    """Relative paths of in-scope files under root."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        if prune:
            dirnames[:] = [d for d in dirnames if not skipped_dir(d)]
        for name in filenames:
            if in_scope(name):
                found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(found)


def citations(text):
    """(line, text as written, section, item or None, part or None)."""
    out = []
    for pattern in (CITATION, PLAIN):
        for m in pattern.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            section, item = int(m.group(1)), m.group(2)
            part = m.group(3) or m.group(4)
            written = m.group(0).strip()
            if pattern is CITATION and re.search(r"SPEC\s*$", text[max(0, m.start() - 6):m.start()]):
                written = "SPEC " + written
            out.append((line, written, section,
                        int(item) if item else None, part))
            if pattern is CITATION and m.group(5):
                out.append((line, written, int(m.group(5)),
                            int(m.group(6)), None))
    return out


def parse_spec(text):
    """Sections, items and parts of docs/spec.md, and problems in its shape."""
    sections, items, problems = set(), {}, []
    current = None
    for number, line in enumerate(text.splitlines(), 1):
        m = re.match(r"## (\d+)\. \S", line)
        if m:
            current = int(m.group(1))
            sections.add(current)
            continue
        m = re.match(r"\*\*(\d+)\.(\d+)\*\* \S", line)
        if m:
            key = (int(m.group(1)), int(m.group(2)))
            if key[0] != current:
                problems.append(f"docs/spec.md:{number}: item {key[0]}.{key[1]} "
                                f"is not under section {key[0]}")
            if key in items:
                problems.append(f"docs/spec.md:{number}: item {key[0]}.{key[1]} twice")
            items[key] = ""
            item = key
            continue
        if line.startswith("## "):
            current = None
        if current is not None and items and item[0] == current:
            items[item] += line + "\n"
    parts = {key: set(re.findall(r"\*\*\(([a-z])\)\*\*", body))
             for key, body in items.items()}
    for section, count in SECTION_ITEMS.items():
        if section not in sections:
            problems.append(f"docs/spec.md: section {section} is missing")
        for n in range(1, count + 1):
            if (section, n) not in items:
                problems.append(f"docs/spec.md: item {section}.{n} is missing")
    for (section, n) in items:
        if n > 1 and (section, n - 1) not in items:
            problems.append(f"docs/spec.md: item {section}.{n - 1} is missing "
                            f"(numbering has a gap before {section}.{n})")
    for key, letters in ITEM_PARTS.items():
        for letter in letters:
            if letter not in parts.get(key, set()):
                problems.append(f"docs/spec.md: part ({letter}) of item "
                                f"{key[0]}.{key[1]} is missing")
    return sections, parts, problems


def main():
    root = os.getcwd()  # the workspace's runfiles
    received = files_under(root, prune=False)
    with open(os.path.join(root, "docs", "spec.md"), encoding="utf-8") as f:
        sections, parts, problems = parse_spec(f.read())

    count = 0
    for path in received:
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for line, written, section, item, part in citations(text):
            count += 1
            if section not in sections:
                missing = f"section {section}"
            elif item is not None and (section, item) not in parts:
                missing = f"item {section}.{item}"
            elif part and (item is None or part not in parts[(section, item)]):
                missing = (f"part ({part}) of item {section}.{item}" if item
                           else f"part ({part}) of section {section}")
            else:
                continue
            problems.append(f"{path}:{line}: cites '{written}', but docs/spec.md "
                            f"has no {missing}")

    packages = {os.path.dirname(p) for p in received
                if os.path.basename(p) == "BUILD"}
    for package in sorted(EXPECTED_PACKAGES - packages):
        problems.append(f"no files from package //{package}: add it to "
                        f"SPEC_CITED_PACKAGES in the root BUILD (its "
                        f"spec_cited_files filegroup)")
    for package in sorted(packages - EXPECTED_PACKAGES):
        problems.append(f"package //{package} is in the data but not in "
                        f"EXPECTED_PACKAGES (docs/spec_citations_test.py): add it")

    # Back to the source tree through the runfiles' links, when they lead there.
    source = os.path.dirname(os.path.realpath(os.path.join(root, "README.md")))
    walked = os.path.isfile(os.path.join(source, "WORKSPACE")) and source != root
    if walked:
        have = set(received)
        missed = {}  # directory -> [(path, first citation)]
        for path in files_under(source, prune=True):
            if path in have:
                continue
            try:
                with open(os.path.join(source, path), encoding="utf-8",
                          errors="replace") as f:
                    cites = citations(f.read())
            except OSError:
                continue
            if cites:
                missed.setdefault(os.path.dirname(path), []).append((path, cites[0]))
        for directory, files in sorted(missed.items()):
            path, (line, written, *_) = files[0]
            problems.append(f"{directory or '.'}/: {len(files)} file(s) cite the "
                            f"specification (first: {path}:{line} '{written}') but are "
                            f"not in the test's data: give the package a "
                            f"spec_cited_files filegroup and add it to "
                            f"SPEC_CITED_PACKAGES in the root BUILD")

    if problems:
        print("\n".join(problems))
        print(f"FAIL: {len(problems)} problem(s); {count} citations in "
              f"{len(received)} files")
        return 1
    print(f"OK: {count} citations in {len(received)} files from "
          f"{len(packages)} packages name sections, items and parts of docs/spec.md"
          + ("; every citing file of the source tree was received" if walked
             else "; source tree not reachable, coverage checked by package list"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
