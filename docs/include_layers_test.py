"""//:include_layers_test: no #include runs back up a layer.

The repository's C++ is layered (README, "Layout"; docs/engine.md): each
room below may include its own files and those of the rooms of lower layers,
never those of a higher layer nor of another room of its own layer. The
order was read off the includes as they are, then the plans were given one
room (engine/plan) and the layer-mode policy interface one room of its own
(engine/policy), which the two policies implementing it (engine/layer,
engine/budget) sit above.

A room is a folder (a Bazel package) or, for the engine's front doors, the
files listed: their headers (engine/offload.h, pipeline_offload.h) are the
public API at the bottom, but their sources pick and own a policy, so they
sit above the policies. Tests (*_test.cc) are not placed: a test drives its
room from above and may include anything (the simulated GPU, testing/).
A file in no room (a new top-level folder) fails the test: place it.
Includes of files outside the tree (gtest, rapidcheck, torch) are ignored.

Needs only /usr/bin/python3. Outside Bazel: python3 docs/include_layers_test.py
(from the repository root).
"""

import fnmatch
import os
import re
import sys

# Bottom first. Each layer: rooms; each room: a folder or file patterns.
LAYERS = [
    ("the engine's public API", [["engine"]]),
    ("plans, shared mechanism", [["engine/plan"], ["engine/core"]]),
    ("the layer-mode policy interface", [["engine/policy"]]),
    ("policies", [["engine/layer"], ["engine/budget"], ["engine/pipeline"]]),
    ("the engine's front doors",
     [["engine/offload.cc", "engine/pipeline_offload.cc"]]),
    ("backends", [["backends/counting"], ["backends/cuda"], ["backends/sim"]]),
    ("workload drivers", [["workload"]]),
    ("test support, timelines", [["testing"], ["timeline"]]),
    ("tools", [["tools"]]),
    ("programs", [["bench"], ["examples"], ["fuzz"], ["props"], ["python"]]),
]

# (including file, included file): why it may run up or across. None now.
EXCEPTIONS = {}

SUFFIXES = (".h", ".cc", ".cu", ".cuh", ".hpp", ".cpp")
SKIP_DIRS = {"third_party", "scratch", ".git", "build", "__pycache__", ".gpu",
             ".gl", ".whl"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def rooms():
    """(layer index, room name, patterns) in order."""
    out = []
    for rank, (_, layer_rooms) in enumerate(LAYERS):
        for patterns in layer_rooms:
            out.append((rank, " ".join(patterns), patterns))
    return out


ROOMS = rooms()


def room_of(path):
    """(rank, room) of a path; files named by a pattern come before folders,
    the deepest folder wins. None for a file in no room."""
    best = None
    for rank, name, patterns in ROOMS:
        for pattern in patterns:
            if any(c in pattern for c in "*?[") or "." in os.path.basename(pattern):
                if fnmatch.fnmatch(path, pattern):
                    return rank, name
            elif path.startswith(pattern + "/"):
                depth = pattern.count("/") + 1
                if best is None or depth > best[0]:
                    best = (depth, rank, name)
    return None if best is None else best[1:]


def is_test(path):
    return path.endswith("_test.cc")


def sources(root):
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames
                       if d not in SKIP_DIRS and not d.startswith("bazel-")
                       and not d.endswith(".egg-info")]
        for name in filenames:
            if name.endswith(SUFFIXES):
                found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(found)


def check(root):
    """Problems, and the count of includes checked."""
    files = sources(root)
    have = set(files)
    problems, count = [], 0
    for path in files:
        if is_test(path):
            continue
        place = room_of(path)
        if place is None:
            problems.append(f"{path}: in no room of LAYERS "
                            f"(docs/include_layers_test.py): place its folder")
            continue
        rank, room = place
        with open(os.path.join(root, path), encoding="utf-8",
                  errors="replace") as f:
            text = f.read()
        for m in INCLUDE.finditer(text):
            included = m.group(1)
            if included not in have:
                continue  # outside the tree: a system or third-party header
            count += 1
            to = room_of(included)
            if to is None:
                continue  # reported as the file's own problem
            to_rank, to_room = to
            if to_room == room or to_rank < rank:
                continue
            if (path, included) in EXCEPTIONS:
                continue
            line = text.count("\n", 0, m.start()) + 1
            if to_rank > rank:
                why = (f"up a layer: {room} ({LAYERS[rank][0]}) is below "
                       f"{to_room} ({LAYERS[to_rank][0]})")
            else:
                why = (f"across its layer: {room} and {to_room} are both "
                       f"{LAYERS[rank][0]}")
            problems.append(f"{path}:{line}: includes {included}, {why}")
    for path, included in sorted(EXCEPTIONS):
        if path not in have:
            problems.append(f"EXCEPTIONS names {path}, which is gone: drop it")
    return problems, count


def main():
    root = os.getcwd()  # the workspace's runfiles, or the checkout
    # Back to the source tree through the runfiles' links, when they lead
    # there: every file is checked, not only those in the test's data.
    source = os.path.dirname(os.path.realpath(os.path.join(root, "README.md")))
    if os.path.isfile(os.path.join(source, "WORKSPACE")):
        root = source
    problems, count = check(root)
    if problems:
        print("\n".join(problems))
        print(f"FAIL: {len(problems)} problem(s); {count} includes checked")
        return 1
    order = " <- ".join(
        "{" + ", ".join(" ".join(p) for p in layer_rooms) + "}"
        for _, layer_rooms in LAYERS)
    print(f"OK: {count} includes between the repository's files, none up a "
          f"layer or across one; layers, bottom first: {order}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
