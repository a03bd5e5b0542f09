"""tools/check_glibc.py on small libraries built here with the system's compilers, each calling a
function that exists at one known symbol version only: getrandom (GLIBC_2.25), close_range
(GLIBC_2.34), std::__throw_bad_alloc (GLIBCXX_3.4), std::__throw_bad_array_new_length
(GLIBCXX_3.4.29). The versions read must be those, the default floor (manylinux_2_28's) must pass
the first and refuse the others, and the reading must agree with binutils' objdump -T."""
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "check_glibc.py"
CC = shutil.which("cc") or shutil.which("gcc")
CXX = shutil.which("c++") or shutil.which("g++")
GLIBC = tuple(int(p) for p in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2])

spec = importlib.util.spec_from_file_location("check_glibc", SCRIPT)
check_glibc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_glibc)

C_GETRANDOM = "#include <sys/random.h>\nlong f(void* b) { return getrandom(b, 4, 0); }\n"
C_CLOSE_RANGE = "int close_range(unsigned, unsigned, int);\nint g(void) { return close_range(3, 9, 0); }\n"
CXX_OLD = "namespace std { [[noreturn]] void __throw_bad_alloc(); }\nvoid h() { std::__throw_bad_alloc(); }\n"
CXX_NEW = ("namespace std { [[noreturn]] void __throw_bad_array_new_length(); }\n"
           "void k() { std::__throw_bad_array_new_length(); }\n")


def build(compiler, source, out, suffix):
    if compiler is None:
        pytest.skip("no C/C++ compiler on PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.parent / (out.name.split(".")[0] + suffix)
    src.write_text(source)
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(out), str(src)], check=True)
    src.unlink()
    return out


def run(*args):
    p = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def row(stdout, name):
    """The table row of the file whose path ends with `name`, split on runs of spaces."""
    lines = [line for line in stdout.splitlines() if line.split(" ")[0].endswith(name)]
    assert len(lines) == 1, stdout
    return re.split(r"\s{2,}", lines[0])


def needs_of(path):
    return check_glibc.needed_versions(pathlib.Path(path).read_bytes())


@pytest.fixture
def old_wheel_dir(tmp_path):
    """An unpacked wheel within the floor: _C calls getrandom, its one bundled library __throw_bad_alloc."""
    root = tmp_path / "unpacked"
    build(CC, C_GETRANDOM, root / "gpufeed" / "_C.abi3.so", ".c")
    build(CXX, CXX_OLD, root / "gpufeed.libs" / "libold-0a1b2c3d.so.1", ".cpp")
    (root / "gpufeed" / "__init__.py").write_text("")
    return root


def test_reads_the_exact_versions_a_library_needs(old_wheel_dir):
    c = needs_of(old_wheel_dir / "gpufeed" / "_C.abi3.so")
    assert c["GLIBC_2.25"] == ["getrandom"]
    assert check_glibc.highest(c)["GLIBC"] == (2, 25)
    lib = needs_of(old_wheel_dir / "gpufeed.libs" / "libold-0a1b2c3d.so.1")
    assert lib["GLIBCXX_3.4"] == ["_ZSt17__throw_bad_allocv"]
    assert check_glibc.highest(lib)["GLIBCXX"] == (3, 4)


def test_a_directory_within_the_floor_passes_and_a_lower_floor_fails(old_wheel_dir):
    rc, out, err = run(old_wheel_dir)
    assert rc == 0, out + err
    assert row(out, "_C.abi3.so") == ["gpufeed/_C.abi3.so", "2.25", "-", "-", "-"]
    assert row(out, "libold-0a1b2c3d.so.1")[2] == "3.4"
    assert out.splitlines()[-1] == ("check_glibc: floor GLIBC_2.28, GLIBCXX_3.4.25, CXXABI_1.3.11: "
                                    "all 2 files within it")
    rc, out, _ = run(old_wheel_dir, "--glibc", "2.24")
    assert rc == 1
    assert row(out, "_C.abi3.so")[-1] == "GLIBC_2.25 (getrandom)"
    assert out.splitlines()[-1].endswith(": 1 of 2 files need more")


@pytest.mark.skipif(GLIBC < (2, 34), reason=f"close_range@GLIBC_2.34 needs glibc >= 2.34; this is {GLIBC}")
def test_a_bundled_library_needing_glibc_2_34_fails_the_wheel(old_wheel_dir, tmp_path):
    build(CC, C_CLOSE_RANGE, old_wheel_dir / "gpufeed.libs" / "libnew-4e5f6a7b.so.2", ".c")
    assert needs_of(old_wheel_dir / "gpufeed.libs" / "libnew-4e5f6a7b.so.2")["GLIBC_2.34"] == ["close_range"]
    whl = tmp_path / "gpufeed-0.1.0-cp312-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for f in sorted(old_wheel_dir.rglob("*")):
            z.write(f, f.relative_to(old_wheel_dir).as_posix())
    for target in (old_wheel_dir, whl):
        rc, out, err = run(target)
        assert rc == 1, out + err
        assert row(out, "libnew-4e5f6a7b.so.2") == ["gpufeed.libs/libnew-4e5f6a7b.so.2", "2.34", "-", "-",
                                                    "GLIBC_2.34 (close_range)"]
        assert row(out, "_C.abi3.so")[-1] == "-"
    assert run(whl, "--glibc", "2.34")[0] == 0


def test_a_glibcxx_above_manylinux_2_28_fails(tmp_path):
    lib = build(CXX, CXX_NEW, tmp_path / "libnewcxx.so", ".cpp")
    try:
        got = needs_of(lib)
    except ValueError:
        got = {}
    if "GLIBCXX_3.4.29" not in got:
        pytest.skip(f"this libstdc++ has no __throw_bad_array_new_length@GLIBCXX_3.4.29 (GCC < 11): {got}")
    assert got["GLIBCXX_3.4.29"] == ["_ZSt28__throw_bad_array_new_lengthv"]
    rc, out, _ = run(lib)
    assert rc == 1
    assert row(out, "libnewcxx.so")[2:] == ["3.4.29", "-", "GLIBCXX_3.4.29 (_ZSt28__throw_bad_array_new_lengthv)"]
    assert run(lib, "--glibcxx", "3.4.29")[0] == 0


@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump (binutils) to compare with")
def test_agrees_with_objdump(old_wheel_dir):
    libs = [old_wheel_dir / "gpufeed" / "_C.abi3.so", old_wheel_dir / "gpufeed.libs" / "libold-0a1b2c3d.so.1"]
    # The system's libz and libcurl where they are there and not hidden (tools/check_wheel.sh binds
    # /dev/null over Debian's libcurl while it runs this suite against the wheel).
    libs += [pathlib.Path(p) for p in ("/lib/x86_64-linux-gnu/libz.so.1", "/usr/lib/x86_64-linux-gnu/libcurl.so.4")
             if os.path.exists(p) and os.path.getsize(p) > 0]
    for lib in libs:
        dump = subprocess.run(["objdump", "-T", str(lib)], capture_output=True, text=True, check=True).stdout
        want = {}
        for m in re.finditer(r"\*UND\*\s+\S+\s+(?:\(([^)]+)\)|(\S+))\s+(\S+)$", dump, re.M):
            if m.group(1):
                want.setdefault(m.group(1), set()).add(m.group(3))
        got = {k: set(v) for k, v in needs_of(lib).items() if v}
        assert got == want, lib


def test_what_is_not_elf_or_not_there_is_an_input_error(tmp_path):
    (tmp_path / "gpufeed").mkdir()
    (tmp_path / "gpufeed" / "_C.abi3.so").write_text("not an ELF file")
    rc, _, err = run(tmp_path)
    assert rc == 2 and "not an ELF file" in err
    rc, _, err = run(tmp_path / "missing.whl")
    assert rc == 2 and "no such file" in err
