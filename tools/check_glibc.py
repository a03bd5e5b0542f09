#!/usr/bin/env python3
"""The oldest glibc and C++ runtime a wheel's native code runs on: the highest GLIBC_x.y,
GLIBCXX_x.y.z and CXXABI_x.y.z symbol versions that gpufeed/_C*.so and every library the wheel
carries (gpufeed.libs/*.so*, where auditwheel repair puts them: tools/build_wheel.sh) need.

The versions are read from each file's own ELF version-needs section (.gnu.version_r, what the
dynamic loader checks before it runs the file), and the symbols that need them from .dynsym and
.gnu.version; no binutils needed. A file needing a version above the floor does not load on an
older system ("version `GLIBC_2.34' not found"). The default floor is the manylinux_2_28 policy's
(auditwheel's policy.json for x86_64): GLIBC_2.28, GLIBCXX_3.4.25, CXXABI_1.3.11.

  tools/check_glibc.py WHEEL.whl|DIR|FILE.so... [--glibc 2.28] [--glibcxx 3.4.25] [--cxxabi 1.3.11]

A DIR is searched for _C*.so and *.libs/*.so* (an unpacked wheel or an install's site-packages);
a FILE is checked as it is. Prints one row per file (the highest of each version it needs, and
which symbols need the versions above the floor), then a summary line.

Exit status 0 when no file needs a version above the floor; 1 when one does (each such version is
printed with up to three of the symbols that need it); 2 when the input cannot be read.
"""
import argparse
import re
import struct
import sys
import tempfile
import zipfile
from pathlib import Path

SHT_DYNSYM = 11
SHT_GNU_VERNEED = 0x6FFFFFFE
SHT_GNU_VERSYM = 0x6FFFFFFF
FAMILIES = ("GLIBC", "GLIBCXX", "CXXABI")
VERSION = re.compile(r"^(GLIBC|GLIBCXX|CXXABI)_(\d+(?:\.\d+)*)$")


class NotElf(Exception):
    pass


def parse_version(text):
    return tuple(int(p) for p in text.split("."))


def show(version):
    return ".".join(str(p) for p in version)


def _cstr(data, offset):
    end = data.index(b"\0", offset)
    return data[offset:end].decode("ascii", "replace")


def _sections(data):
    """(fmt prefix, 64-bit?, [(type, offset, size, link, entsize)]) of an ELF file's section headers."""
    if data[:4] != b"\x7fELF":
        raise NotElf("not an ELF file")
    is64 = data[4] == 2
    end = "<" if data[5] == 1 else ">"
    if is64:
        shoff, = struct.unpack_from(end + "Q", data, 0x28)
        shentsize, shnum = struct.unpack_from(end + "HH", data, 0x3A)
        layout = end + "IIQQQQIIQQ"
    else:
        shoff, = struct.unpack_from(end + "I", data, 0x20)
        shentsize, shnum = struct.unpack_from(end + "HH", data, 0x2E)
        layout = end + "IIIIIIIIII"
    if shoff == 0 or shnum == 0:
        raise NotElf("no section headers")
    sections = []
    for i in range(shnum):
        f = struct.unpack_from(layout, data, shoff + i * shentsize)
        # name, type, flags, addr, offset, size, link, info, addralign, entsize
        sections.append((f[1], f[4], f[5], f[6], f[9]))
    return end, is64, sections


def needed_versions(data):
    """{version name: sorted names of the undefined symbols that need it} of one ELF file's
    version needs (GLIBC_2.14, GLIBCXX_3.4.29, GCC_3.0, ...); a version needed by no symbol
    (only listed in .gnu.version_r) maps to []."""
    end, is64, sections = _sections(data)
    by_index = {}  # the vna_other index a .gnu.version entry refers to -> version name
    for typ, off, size, link, _ in sections:
        if typ != SHT_GNU_VERNEED:
            continue
        strtab = sections[link][1]
        vn = off
        while True:
            _, cnt, _, aux, nxt = struct.unpack_from(end + "HHIII", data, vn)
            vna = vn + aux
            for _ in range(cnt):
                _, _, other, name, vna_next = struct.unpack_from(end + "IHHII", data, vna)
                by_index[other & 0x7FFF] = _cstr(data, strtab + name)
                vna += vna_next
            if nxt == 0:
                break
            vn += nxt
    needs = {name: set() for name in by_index.values()}
    dynsym = next((s for s in sections if s[0] == SHT_DYNSYM), None)
    versym = next((s for s in sections if s[0] == SHT_GNU_VERSYM), None)
    if dynsym and versym:
        _, off, size, link, entsize = dynsym
        strtab = sections[link][1]
        for i in range(size // entsize):
            at = off + i * entsize
            if is64:
                name, _, _, shndx = struct.unpack_from(end + "IBBH", data, at)
            else:
                name, = struct.unpack_from(end + "I", data, at)
                shndx, = struct.unpack_from(end + "H", data, at + 14)
            index, = struct.unpack_from(end + "H", data, versym[1] + 2 * i)
            version = by_index.get(index & 0x7FFF)
            if shndx == 0 and version is not None:  # undefined here, versioned: needed from a library
                needs[version].add(_cstr(data, strtab + name))
    return {k: sorted(v) for k, v in needs.items()}


def highest(needs):
    """{family: the highest version tuple needed} over GLIBC, GLIBCXX, CXXABI."""
    out = {}
    for name in needs:
        m = VERSION.match(name)
        if m:
            fam, v = m.group(1), parse_version(m.group(2))
            best = out.get(fam)
            if best is None or v > best:
                out[fam] = v
    return out


def over_floor(needs, floor):
    """[(version name, symbols)] of the versions above `floor` ({family: version tuple}), highest first."""
    over = []
    for name, symbols in needs.items():
        m = VERSION.match(name)
        if m and parse_version(m.group(2)) > floor[m.group(1)]:
            over.append((name, symbols))
    return sorted(over, key=lambda x: (x[0].split("_")[0], parse_version(x[0].split("_", 1)[1])), reverse=True)


def wheel_files(root):
    """The extension modules, then the bundled libraries, under `root` (each sorted by path)."""
    found = set(root.rglob("_C*.so"))
    for libs in root.rglob("*.libs"):
        if libs.is_dir():
            found.update(p for p in libs.iterdir() if p.is_file() and ".so" in p.name)
    return sorted(found, key=lambda p: (not p.name.startswith("_C"), str(p.relative_to(root))))


def check(paths):
    """[(label, needs)] of the files `paths` name: wheels unpacked, directories searched."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for arg in paths:
            p = Path(arg)
            if not p.exists():
                raise FileNotFoundError(f"{arg}: no such file or directory")
            if p.suffix == ".whl":
                root = Path(tmp) / p.name
                zipfile.ZipFile(p).extractall(root)
                files = [(root, f) for f in wheel_files(root)]
            elif p.is_dir():
                files = [(p, f) for f in wheel_files(p)]
            else:
                files = [(p.parent, p)]
            if not files:
                raise FileNotFoundError(f"{arg}: no _C*.so or *.libs/*.so* in it")
            for root, f in files:
                try:
                    rows.append((str(f.relative_to(root)), needed_versions(f.read_bytes())))
                except (NotElf, struct.error, ValueError, IndexError) as e:
                    raise ValueError(f"{f}: cannot read its ELF version needs: {e}") from e
    return rows


def report(rows, floor):
    """The table's lines and the number of files above the floor."""
    width = max([len(label) for label, _ in rows] + [4])
    lines = [f"{'file':<{width}}  {'GLIBC':>7}  {'GLIBCXX':>8}  {'CXXABI':>7}  above the floor"]
    bad = 0
    for label, needs in rows:
        top = highest(needs)
        cells = [show(top[f]) if f in top else "-" for f in FAMILIES]
        over = over_floor(needs, floor)
        bad += bool(over)
        why = "; ".join(
            f"{name} ({', '.join(syms[:3]) + (f' +{len(syms) - 3} more' if len(syms) > 3 else '') or 'no symbol'})"
            for name, syms in over)
        lines.append(f"{label:<{width}}  {cells[0]:>7}  {cells[1]:>8}  {cells[2]:>7}  {why or '-'}")
    return lines, bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="a wheel (.whl), a directory, or ELF files")
    ap.add_argument("--glibc", default="2.28", help="highest GLIBC_ version allowed (default 2.28)")
    ap.add_argument("--glibcxx", default="3.4.25", help="highest GLIBCXX_ version allowed (default 3.4.25)")
    ap.add_argument("--cxxabi", default="1.3.11", help="highest CXXABI_ version allowed (default 1.3.11)")
    a = ap.parse_args(argv)
    try:
        floor = {"GLIBC": parse_version(a.glibc), "GLIBCXX": parse_version(a.glibcxx),
                 "CXXABI": parse_version(a.cxxabi)}
    except ValueError:
        print("check_glibc: a floor is a version such as 2.28", file=sys.stderr)
        return 2
    try:
        rows = check(a.paths)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        print(f"check_glibc: {e}", file=sys.stderr)
        return 2
    lines, bad = report(rows, floor)
    print("\n".join(lines))
    print(f"check_glibc: floor GLIBC_{a.glibc}, GLIBCXX_{a.glibcxx}, CXXABI_{a.cxxabi}: "
          f"{bad} of {len(rows)} files need more" if bad else
          f"check_glibc: floor GLIBC_{a.glibc}, GLIBCXX_{a.glibcxx}, CXXABI_{a.cxxabi}: all {len(rows)} files within it")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
