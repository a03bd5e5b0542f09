#!/usr/bin/env python3
"""The rooms' layering: every `#include "gpufeed/..."` names a header of its own room or of a room above it.

The rooms and their order are the rows of the rooms table in docs/ARCHITECTURE.md (its first
column, a folder such as `loader/datasets/`); a room may use the rooms above it, never those below.
A file belongs to the room with the longest folder that holds it (loader/datasets/src/dataset.cpp is
datasets', not loader's), and so does a header: gpufeed/loader/dataset.h is the room whose
include/ folder holds it. Every source and header under the rooms' folders is read.

  python3 tools/check_layers.py [--root DIR]   # DIR: the checkout (default: the one holding this script)
  python3 tools/check_layers.py --self-test    # the checker on small made-up trees (ctest: room_layers_selftest)

Exit status 0 when every include is allowed; 1 with one `file:line: ...` line per offending include
(a header of a room below, or a header no room has); 2 when the table cannot be read.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

TABLE_DOC = "docs/ARCHITECTURE.md"
# Headers made by the build, not found in a room's include/: the room that installs them.
GENERATED = {"gpufeed/version.h": "common/"}  # cmake/version.h.in, gpufeed_version_header(gpufeed_common)
SOURCE_SUFFIXES = {".h", ".hpp", ".hh", ".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](gpufeed/[^">]+)[">]')
ROW = re.compile(r"^\|\s*`([^`]+/)`\s*\|")


def die(message):
    print(f"check_layers: {message}", file=sys.stderr)
    sys.exit(2)


def read_rooms(root):
    """The rooms table's folders, top row first."""
    doc = root / TABLE_DOC
    if not doc.is_file():
        die(f"{doc} not found")
    rooms, in_section = [], False
    for line in doc.read_text().splitlines():
        if line.startswith("## "):
            if in_section:
                break
            in_section = line.strip() == "## Rooms"
        elif in_section:
            m = ROW.match(line)
            if m:
                rooms.append(m.group(1))
    if not rooms:
        die(f"no rooms table (rows starting with | `folder/` |) under '## Rooms' in {doc}")
    for room in rooms:
        if not (root / room).is_dir():
            die(f"{TABLE_DOC} names the room {room}, which is not a folder of {root}")
    if len(set(rooms)) != len(rooms):
        die(f"a room is named twice in {TABLE_DOC}: {rooms}")
    return rooms


def room_of(path, rooms):
    """The room (its folder) holding `path` (relative, with /), or None: the longest folder wins."""
    best = None
    for room in rooms:
        if path.startswith(room) and (best is None or len(room) > len(best)):
            best = room
    return best


def files_of(root, rooms):
    """Every source and header below the rooms' folders, relative to root, each once."""
    found = set()
    for room in rooms:
        for dirpath, dirnames, filenames in os.walk(root / room):
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and not d.startswith("build")
                           and d != "__pycache__"]
            for name in filenames:
                if Path(name).suffix in SOURCE_SUFFIXES:
                    found.add((Path(dirpath) / name).relative_to(root).as_posix())
    return sorted(found)


def check(root):
    rooms = read_rooms(root)
    rank = {room: i for i, room in enumerate(rooms)}
    files = files_of(root, rooms)
    owner, problems = dict(GENERATED), []
    for path in files:
        room = room_of(path, rooms)
        rest = path[len(room):]
        if rest.startswith("include/"):
            name = rest[len("include/"):]
            if name in owner:
                problems.append(f"{path}: the header {name} is also {owner[name]}'s")
            owner[name] = room
    for path in files:
        room = room_of(path, rooms)
        with open(root / path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                name = m.group(1)
                if name not in owner:
                    problems.append(f"{path}:{number}: #include \"{name}\": no room has this header")
                elif rank[owner[name]] > rank[room]:
                    problems.append(f"{path}:{number}: #include \"{name}\": a header of {owner[name]}, which is "
                                    f"below {room} in {TABLE_DOC}'s rooms table (a room may use only itself and "
                                    "the rooms above it)")
    return rooms, files, problems


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    p.add_argument("--self-test", action="store_true", help="run the checker on made-up trees")
    a = p.parse_args()
    if a.self_test:
        return self_test()
    rooms, files, problems = check(a.root.resolve())
    for line in problems:
        print(line)
    if problems:
        print(f"check_layers: {len(problems)} offending include(s) in {len(files)} files of {len(rooms)} rooms")
        return 1
    print(f"check_layers: OK, {len(files)} files of {len(rooms)} rooms ({', '.join(rooms)})")
    return 0


# --- self-test -----------------------------------------------------------------------------------

FAKE_TABLE = """# fake

## Rooms

| folder | target | owns | may use |
|---|---|---|---|
| `common/` | c | helpers | nothing |
| `loader/datasets/` | d | datasets | common |
| `loader/` | l | loader | everything above |
| `tools/` | t | the CLI | everything |

## Next section

| `tools/` | not a room row: outside the Rooms section |
"""

FAKE_CLEAN = {
    "common/include/gpufeed/log.h": "#pragma once\n",
    "common/src/log.cpp": '#include "gpufeed/log.h"\n#include <string>\n',
    "loader/datasets/include/gpufeed/loader/dataset.h": '#pragma once\n#include "gpufeed/log.h"\n',
    "loader/datasets/src/dataset.cpp": '#include "gpufeed/loader/dataset.h"\n#include "index_cache.h"\n',
    "loader/include/gpufeed/loader/loader.h": '#pragma once\n#include "gpufeed/loader/dataset.h"\n',
    "loader/include/gpufeed/loader.h": '#pragma once\n#include "gpufeed/loader/loader.h"\n#include "gpufeed/version.h"\n',
    "loader/src/loader.cpp": '#include "gpufeed/loader/loader.h"\n  #  include <gpufeed/log.h>\n',
    "tools/main.cpp": '#include <gpufeed/loader.h>\n',
    # Not read: a build folder inside a room, and a file that is no source.
    "loader/build/gen.h": '#include "gpufeed/nowhere.h"\n',
    "loader/notes.md": '#include "gpufeed/nowhere.h"\n',
}


def make_tree(base, files):
    (base / "docs").mkdir(parents=True)
    (base / TABLE_DOC).write_text(FAKE_TABLE)
    for path, text in files.items():
        (base / path).parent.mkdir(parents=True, exist_ok=True)
        (base / path).write_text(text)


def run_on(base):
    r = subprocess.run([sys.executable, __file__, "--root", str(base)], text=True, capture_output=True)
    return r.returncode, r.stdout + r.stderr


def self_test():
    failures = []

    def expect(what, ok):
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        clean = Path(tmp) / "clean"
        make_tree(clean, FAKE_CLEAN)
        rc, out = run_on(clean)
        expect(f"a clean tree passes (rc {rc}): {out.strip()}", rc == 0 and "4 rooms" in out)

        # A sub-room using the room that holds its folder (datasets -> loader), and common using loader.
        bad = Path(tmp) / "bad"
        make_tree(bad, dict(FAKE_CLEAN, **{
            "loader/datasets/src/dataset.cpp": '#include "gpufeed/loader/dataset.h"\n\n#include "gpufeed/loader/loader.h"\n',
            "common/include/gpufeed/log.h": '#pragma once\n#include "gpufeed/loader.h"\n',
        }))
        rc, out = run_on(bad)
        expect(f"a header of a room below fails (rc {rc})", rc == 1)
        expect("... naming file:line and the include (datasets -> loader)",
               'loader/datasets/src/dataset.cpp:3: #include "gpufeed/loader/loader.h"' in out)
        expect("... and (common -> loader)", 'common/include/gpufeed/log.h:2: #include "gpufeed/loader.h"' in out)
        expect("... and only those two", out.count("#include") == 2)

        unknown = Path(tmp) / "unknown"
        make_tree(unknown, dict(FAKE_CLEAN, **{"tools/main.cpp": '#include "gpufeed/loader/missing.h"\n'}))
        rc, out = run_on(unknown)
        expect(f"a header no room has fails (rc {rc})",
               rc == 1 and 'tools/main.cpp:1: #include "gpufeed/loader/missing.h": no room has' in out)

        stale = Path(tmp) / "stale"
        make_tree(stale, FAKE_CLEAN)
        (stale / TABLE_DOC).write_text(FAKE_TABLE.replace("`loader/datasets/`", "`loader/gone/`"))
        rc, out = run_on(stale)
        expect(f"a table row naming no folder is an error (rc {rc})", rc == 2 and "loader/gone/" in out)

    # The checkout's own table parses into rooms that exist, top row first.
    rooms = read_rooms(Path(__file__).resolve().parent.parent)
    expect(f"this checkout's table: {rooms}", rooms[0] == "common/" and "loader/datasets/" in rooms)
    print("self-test: " + ("OK" if not failures else f"{len(failures)} failed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
