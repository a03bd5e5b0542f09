#!/usr/bin/env python3
"""The rooms' layering: every `#include "gpufeed/..."` names a header of its own room or of a room above it,
and every function a room's header declares is defined in that room.

The rooms and their order are the rows of the rooms table in docs/ARCHITECTURE.md (its first
column, a folder such as `loader/datasets/`); a room may use the rooms above it, never those below.
A file belongs to the room with the longest folder that holds it (loader/datasets/src/dataset.cpp is
datasets', not loader's), and so does a header: gpufeed/datasets/dataset.h is the room whose
include/ folder holds it. Every source and header under the rooms' folders is read.

  python3 tools/check_layers.py [--root DIR]   # DIR: the checkout (default: the one holding this script)
  python3 tools/check_layers.py --self-test    # the checker on small made-up trees (ctest: room_layers_selftest)

A definition belongs to the room of its header: a function declared at namespace scope in one
room's public header (`const Schema<DataOptions>& data_options_schema();` in loader/datasets/)
and defined in another room's source is refused, as is a member function defined in a room
other than the one whose header declares its class. An include check cannot see that (the
defining file includes the header legally, from below), but a program that links only the
declaring room's library fails to link. Functions are matched by name and parameter types, so
overloads (to_string(ErrorPolicy) in loader/, to_string(AutoAugmentPolicy) in transforms/) are
told apart. The reading is textual, for this code's style: namespace-scope declarations and
definitions start in the first column, a definition's body opens before any `;`.

Exit status 0 when every include and definition is allowed; 1 with one `file:line: ...` line per
offending include (a header of a room below, or a header no room has) or definition (a function
of another room's header); 2 when the table cannot be read.
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
# A sub-room's header at its old path forwards to the new one for users outside the project; inside
# it, every include names the new path (the test of the forwarders is the one exception).
FORWARDING = "// Forwarding header:"
FORWARDING_TEST = "tests/test_forwarding_headers.cpp"
SOURCE_SUFFIXES = {".h", ".hpp", ".hh", ".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](gpufeed/[^">]+)[">]')
ROW = re.compile(r"^\|\s*`([^`]+/)`\s*\|")
# A namespace-scope function head: return type, then a (qualified) name, then "(".
HEAD = re.compile(r"^(?:[\w:<>,&*\[\]\s]+?[\s&*])?((?:\w+::)*~?\w+)\s*\(")
TYPE_HEAD = re.compile(r"^(?:template\s*<[^>]*>\s*)?(?:struct|class)\s+(?:\[\[[^\]]*\]\]\s*)?(\w+)\b[^;]*$")
NOT_FUNCTIONS = {"if", "for", "while", "switch", "return", "sizeof", "decltype", "static_assert", "alignas",
                 "TEST", "TEST_F", "TEST_P", "INSTANTIATE_TEST_SUITE_P", "NB_MODULE", "PYBIND11_MODULE"}


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


def strip_comments(text):
    """The text without comments and string or character literals (their lines kept, so line numbers hold)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def statements(text):
    """(line, text, ends) of every statement that starts in the first column at namespace scope:
    ends is "{" or ";". Bodies of functions, classes and unnamed namespaces are skipped (they hold
    no namespace-scope declarations of a header's functions)."""
    lines = text.split("\n")
    found, depth, scopes = [], 0, []  # scopes: True for a named namespace's brace
    k = 0
    while k < len(lines):
        line = lines[k]
        at_namespace_scope = all(scopes)
        if at_namespace_scope and line[:1] not in ("", " ", "\t", "#", "}", "{"):
            start, buf, j = k, [], k
            while j < len(lines):
                buf.append(lines[j])
                joined = " ".join(buf)
                semi, brace = joined.find(";"), joined.find("{")
                if semi >= 0 or brace >= 0:
                    break
                j += 1
            joined = " ".join(buf)
            semi, brace = joined.find(";"), joined.find("{")
            ends = "{" if brace >= 0 and (semi < 0 or brace < semi) else ";"
            head = joined[:brace if ends == "{" else semi]
            found.append((start + 1, " ".join(head.split()), ends))
        for c in line:
            if c == "{":
                named = at_namespace_scope and re.match(r"^\s*(inline\s+)?namespace\s+[\w:]+\s*\{", line) is not None
                scopes.append(named)
                at_namespace_scope = all(scopes)
                depth += 1
            elif c == "}" and scopes:
                scopes.pop()
                at_namespace_scope = all(scopes)
                depth -= 1
        k += 1
    return found


def parameter_types(head):
    """The parameter list of a function head as its types: names and default arguments dropped."""
    open_ = head.find("(")
    depth, close = 0, len(head)
    for i in range(open_, len(head)):
        depth += head[i] == "("
        depth -= head[i] == ")"
        if depth == 0:
            close = i
            break
    inner, parts, depth, cur = head[open_ + 1:close], [], 0, ""
    for c in inner:
        depth += c in "<([" 
        depth -= c in ">)]"
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    types = []
    for part in parts:
        part = part.split("=")[0].strip()
        if not part or part == "void":
            continue
        words = re.match(r"^(.*?[\w>&*\]])\s+(\w+)$", part)
        if words and words.group(1).strip() not in ("const", "unsigned", "signed", "struct", "class"):
            part = words.group(1)
        types.append(re.sub(r"\s*([&*<>,])\s*", r"\1", part.replace("gpufeed::", "")))
    return tuple(types)


def function_of(head):
    """(name, parameter types) of a statement head that is a function, or None."""
    if head.startswith(("template", "namespace", "using", "typedef", "extern \"", "enum", "friend", "return")):
        head = re.sub(r"^template\s*<.*?>\s*", "", head) if head.startswith("template") else ""
    m = HEAD.match(head)
    if not head or not m or "=" in head[:m.start(1)] or "operator" in head[:m.end(1)]:
        return None
    name = m.group(1)
    if name.split("::")[-1] in NOT_FUNCTIONS or re.match(r"^(struct|class|union|enum)\b", head):
        return None
    return name, parameter_types(head[m.end(1):])


def definitions_problems(root, rooms, files):
    """A function declared in one room's header and defined in another room's source."""
    declared, classes = {}, {}  # (name, types) -> rooms; class name -> room
    for path in files:
        if "/include/" not in path:
            continue
        room = room_of(path, rooms)
        text = strip_comments((root / path).read_text(encoding="utf-8", errors="replace"))
        for line in text.split("\n"):
            t = TYPE_HEAD.match(line)
            if t:
                classes.setdefault(t.group(1), room)
        for _, head, ends in statements(text):
            fn = function_of(head) if ends == ";" else None
            if fn and "::" not in fn[0] and not head.startswith(("inline", "constexpr", "static")):
                declared.setdefault(fn, set()).add(room)
    problems = []
    for path in files:
        if Path(path).suffix not in (".cpp", ".cc", ".cxx", ".cu") or "/include/" in path:
            continue
        room = room_of(path, rooms)
        text = strip_comments((root / path).read_text(encoding="utf-8", errors="replace"))
        for number, head, ends in statements(text):
            fn = function_of(head) if ends == "{" else None
            if not fn:
                continue
            name, types = fn
            if "::" in name:
                owner = classes.get(name.split("::")[-2])
                if owner is not None and owner != room:
                    problems.append(f"{path}:{number}: {name}(): a member of {name.split('::')[-2]}, whose "
                                    f"header is {owner}'s, defined in {room} (define it in {owner})")
                continue
            owners = declared.get((name, types), set())
            if owners and room not in owners:
                owner = sorted(owners)[0]
                problems.append(f"{path}:{number}: {name}(): declared in a header of {owner}, defined in {room} "
                                f"(a program linking only {owner}'s library would not link; define it in {owner})")
    return problems


def path_name(path, rooms):
    """The include name of a room's header (gpufeed/...), or None for a file outside include/."""
    rest = path[len(room_of(path, rooms)):]
    return rest[len("include/"):] if rest.startswith("include/") else None


def forwarding_headers(root, files, rooms):
    """{old include name: new include name} of the forwarding headers: a header whose comment
    opens with FORWARDING and that includes one header, the one it forwards to."""
    found = {}
    for path in files:
        name = path_name(path, rooms)
        if name is None:
            continue
        text = (root / path).read_text(encoding="utf-8", errors="replace")
        if FORWARDING in text[:300]:
            targets = [m.group(1) for m in map(INCLUDE.match, text.splitlines()) if m]
            if len(targets) == 1:
                found[name] = targets[0]
    return found


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
    forwarders = forwarding_headers(root, files, rooms)
    for path in files:
        room = room_of(path, rooms)
        with open(root / path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                name = m.group(1)
                if name in forwarders and path != FORWARDING_TEST and forwarders.get(path_name(path, rooms)) is None:
                    problems.append(f"{path}:{number}: #include \"{name}\": a forwarding header kept for users "
                                    f"of the old path; include \"{forwarders[name]}\"")
                elif name not in owner:
                    problems.append(f"{path}:{number}: #include \"{name}\": no room has this header")
                elif rank[owner[name]] > rank[room]:
                    problems.append(f"{path}:{number}: #include \"{name}\": a header of {owner[name]}, which is "
                                    f"below {room} in {TABLE_DOC}'s rooms table (a room may use only itself and "
                                    "the rooms above it)")
    problems += definitions_problems(root, rooms, files)
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
        print(f"check_layers: {len(problems)} offending include(s) or definition(s) in {len(files)} files of "
              f"{len(rooms)} rooms")
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
    "loader/datasets/include/gpufeed/datasets/dataset.h": '#pragma once\n#include "gpufeed/log.h"\n',
    "loader/datasets/src/dataset.cpp": '#include "gpufeed/datasets/dataset.h"\n#include "index_cache.h"\n',
    "loader/include/gpufeed/loader/loader.h": '#pragma once\n#include "gpufeed/datasets/dataset.h"\n',
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
            "loader/datasets/src/dataset.cpp": '#include "gpufeed/datasets/dataset.h"\n\n#include "gpufeed/loader/loader.h"\n',
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

        # A function declared in datasets' header and defined in the loader's source (with the
        # same name declared for another type in the loader's own header: overloads are told
        # apart), and a member of datasets' class defined in the loader.
        cross = Path(tmp) / "cross"
        make_tree(cross, dict(FAKE_CLEAN, **{
            "loader/datasets/include/gpufeed/datasets/dataset.h":
                '#pragma once\nnamespace gpufeed::loader {\nstruct DataOptions {\n  int n = 0;\n  void validate() const;\n};\n'
                '/// Its schema.\nconst Schema<DataOptions>& data_options_schema();\nstd::string_view to_string(Kind kind);\n}\n',
            "loader/include/gpufeed/loader/loader.h":
                '#pragma once\n#include "gpufeed/datasets/dataset.h"\nnamespace gpufeed::loader {\n'
                'std::string_view to_string(ErrorPolicy policy);\n}\n',
            "loader/src/loader.cpp":
                '#include "gpufeed/loader/loader.h"\nnamespace gpufeed::loader {\nnamespace {\n'
                'int to_string(Kind k) { return 0; }  // a local helper of the same shape: not a definition of the header\'s\n'
                '}  // namespace\n\nstd::string_view to_string(ErrorPolicy policy) { return "raise"; }\n\n'
                '// data_options_schema() { in a comment is no definition\n'
                'const Schema<DataOptions>& data_options_schema() {\n  return made_once<make>();\n}\n\n'
                'void DataOptions::validate() const {\n  if (n < 0) throw 1;\n}\n}  // namespace gpufeed::loader\n',
        }))
        rc, out = run_on(cross)
        expect(f"a function of a header defined in another room fails (rc {rc})", rc == 1)
        expect("... naming file:line, the function and both rooms",
               "loader/src/loader.cpp:10: data_options_schema(): declared in a header of loader/datasets/, "
               "defined in loader/" in out)
        expect("... and a member of another room's class",
               "loader/src/loader.cpp:14: DataOptions::validate(): a member of DataOptions, whose header is "
               "loader/datasets/'s, defined in loader/" in out)
        expect("... and nothing else (the own room's overload and the unnamed namespace's helper pass)",
               out.count("defined in") == 2)
        moved = Path(tmp) / "moved"
        files = {k: v for k, v in FAKE_CLEAN.items()}
        files["loader/datasets/include/gpufeed/datasets/dataset.h"] = \
            '#pragma once\nnamespace gpufeed::loader {\nconst Schema<DataOptions>& data_options_schema();\n}\n'
        files["loader/datasets/src/data_options.cpp"] = \
            '#include "gpufeed/datasets/dataset.h"\nnamespace gpufeed::loader {\n' \
            'const Schema<DataOptions>& data_options_schema() {\n  return s;\n}\n}\n'
        make_tree(moved, files)
        rc, out = run_on(moved)
        expect(f"... and passes once defined in its own room (rc {rc})", rc == 0)

        forward = Path(tmp) / "forward"
        make_tree(forward, dict(FAKE_CLEAN, **{
            "loader/datasets/include/gpufeed/loader/dataset.h":
                '#pragma once\n// Forwarding header: this room\'s header is <gpufeed/datasets/dataset.h>.\n'
                '#include "gpufeed/datasets/dataset.h"\n',
            "loader/src/loader.cpp": '#include "gpufeed/loader/dataset.h"\n',
            FORWARDING_TEST: '#include "gpufeed/loader/dataset.h"\n',
        }))
        (forward / TABLE_DOC).write_text(FAKE_TABLE.replace("| `tools/` |", "| `tests/` | x | tests | everything |\n| `tools/` |"))
        rc, out = run_on(forward)
        expect(f"an include of a forwarding header inside the project fails (rc {rc})",
               rc == 1 and 'loader/src/loader.cpp:1: #include "gpufeed/loader/dataset.h": a forwarding header' in out
               and 'include "gpufeed/datasets/dataset.h"' in out)
        expect("... except in the forwarders' own test", out.count("forwarding header kept") == 1)

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
