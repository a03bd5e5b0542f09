"""Stub CUDA libraries that let PyPI's aarch64 torch (a CUDA build) import on a machine without CUDA.

    python3 tools/wheel/cuda_stubs.py SITE SYSROOT OUT_DIR

SITE holds torch (and torchvision, when installed: its _C.so needs libcudart.so.13 too), as pip
install --target puts them; SYSROOT is the aarch64 root qemu runs with (-L).

torch's aarch64 wheels on PyPI from 2.11 on are CUDA 13 builds: libtorch_cpu.so, libtorch_cuda.so
and libtorch_python.so list libcudart.so.13, libcublas.so.13, libcudnn.so.9, libnccl.so.2 and
more as DT_NEEDED, which the nvidia-* wheels (gigabytes) would provide. Under qemu-user there is no
GPU, and nothing in gpufeed's CPU path calls CUDA, so each of those libraries is replaced here by
a small aarch64 shared library of the same soname that defines every symbol torch's libraries
take from it (with the symbol versions they ask for: a missing version needed is fatal to ld.so).
Every function returns a pointer to a zeroed buffer (a non-zero int: an error code to callers
that read an int, an empty string to callers that read a char*), except cudaGetDeviceCount,
which reports no device (cudaErrorNoDevice, count 0), so torch.cuda.is_available() is False as
on any machine without a GPU.

Which library a symbol comes from: the version it references names the file (readelf -V); an
unversioned undefined symbol that no torch library and no sysroot library defines goes into
every stub (the first one loaded answers). Built with clang --target=aarch64-linux-gnu and lld,
no aarch64 sysroot needed (-nostdlib, no headers).
"""
import collections
import os
import pathlib
import re
import subprocess
import sys

SYSTEM = re.compile(r"^(ld-linux-aarch64|libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libz)\.so")
# The one function whose answer matters: torch.cuda.is_available() asks it (c10::cuda::device_count).
SPECIAL = {"cudaGetDeviceCount": "int cudaGetDeviceCount(int *n) { *n = 0; return 100; /* cudaErrorNoDevice */ }"}


def readelf(*args: str) -> str:
    return subprocess.run(["readelf", "-W", *args], check=True, capture_output=True, text=True).stdout


def version_files(lib: pathlib.Path) -> dict:
    """version name -> the file that must define it (the .gnu.version_r section)."""
    out, current = {}, None
    for line in readelf("-V", str(lib)).splitlines():
        m = re.search(r"File: (\S+)", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"Name: (\S+)\s+Flags", line)
        if m and current:
            out[m.group(1)] = current
    return out


def dynsyms(lib: pathlib.Path):
    """(name, version or None, defined, type, bind) of each dynamic symbol."""
    for line in readelf("--dyn-syms", str(lib)).splitlines():
        f = line.split()
        if len(f) < 8 or not f[0].endswith(":"):
            continue
        name, _, ver = f[7].partition("@")
        yield name, ver.lstrip("@") or None, f[6] != "UND", f[3], f[4]


def elf_files(d: pathlib.Path):
    for p in sorted(d.rglob("*.so*")):
        if p.is_file() and not p.is_symlink():
            with open(p, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    yield p


def collect(site: pathlib.Path, sysroot: pathlib.Path):
    """{missing soname: {version or None: {symbol: type}}} over torch's (and torchvision's) libraries."""
    packages = [site / d for d in ("torch", "torchvision", "torchvision.libs") if (site / d).is_dir()]
    libs = [p for d in packages for p in elf_files(d)]
    present = {p.name for p in libs}
    interpreters = [p for p in (sysroot / "usr/bin").glob("python3*") if not p.is_symlink()]
    defined = set()
    for p in [*interpreters, *libs, *(q for d in (sysroot / "lib", sysroot / "usr/lib") for q in elf_files(d))]:
        defined |= {n for n, _, is_def, _, _ in dynsyms(p) if is_def}
    wanted = collections.defaultdict(lambda: collections.defaultdict(dict))
    loose = {}
    for lib in libs:
        needed = re.findall(r"\(NEEDED\).*\[(.*)\]", readelf("-d", str(lib)))
        missing = [n for n in needed if n not in present and not SYSTEM.match(n)]
        for n in missing:
            wanted[n]  # every missing soname gets a stub, even one whose symbols are all unversioned
        files = version_files(lib)
        for name, ver, is_def, typ, bind in dynsyms(lib):
            if is_def or bind == "WEAK" or not name:
                continue
            if ver and files.get(ver) in missing:
                wanted[files[ver]][ver][name] = typ
            elif not ver and name not in defined:
                loose[name] = typ
    for soname in wanted:
        wanted[soname][None].update({n: t for n, t in loose.items()
                                     if not any(n in syms for syms in wanted[soname].values())})
    return wanted


def write_stub(out: pathlib.Path, soname: str, versions: dict) -> None:
    stem = out / soname
    code = ["static char gpufeed_zero[4096] __attribute__((aligned(16)));",
            "void *gpufeed_stub(void) { return gpufeed_zero + 8; }"]
    for syms in versions.values():
        for name, typ in sorted(syms.items()):
            if name in SPECIAL:
                code.append(SPECIAL[name])
            elif typ == "OBJECT":
                code.append(f'char {name}[64] __asm__("{name}");')
            else:
                code.append(f'void *{name}(void) __attribute__((alias("gpufeed_stub")));')
    stem.with_suffix(stem.suffix + ".c").write_text("\n".join(code) + "\n")
    named = [v for v in versions if v]
    script = []
    for v in named:  # the unversioned symbols go into the first version: the default one
        syms = list(versions[v]) + (list(versions.get(None, {})) if v == named[0] else [])
        script.append(f"{v} {{ global: {'; '.join(syms) or '*'}; }};")
    if not named:
        script.append(f"{{ global: {'; '.join(versions.get(None, {})) or '*'}; local: *; }};")
    else:
        script[0] = script[0].replace("; };", "; local: *; };")
    stem.with_suffix(stem.suffix + ".map").write_text("\n".join(script) + "\n")
    subprocess.run(["clang", "--target=aarch64-linux-gnu", "-fuse-ld=lld", "-nostdlib", "-shared", "-fPIC",
                    "-O1", "-w", f"-Wl,-soname,{soname}", f"-Wl,--version-script={stem}.map",
                    "-o", str(stem), f"{stem}.c"], check=True)


def main() -> None:
    site, sysroot, out = map(pathlib.Path, sys.argv[1:4])
    out.mkdir(parents=True, exist_ok=True)
    wanted = collect(site, sysroot)
    for soname, versions in sorted(wanted.items()):
        write_stub(out, soname, versions)
        print(f"cuda_stubs: {soname}: {sum(len(s) for s in versions.values())} symbols")
    (out / ".complete").write_text("\n".join(sorted(wanted)) + "\n")


if __name__ == "__main__":
    main()
