#!/usr/bin/env python3
"""gpufeed as an installed package, end to end (ctest: package_install_examples).

1. `cmake --install BUILD --prefix WORK/stage`, then the prefix is moved to WORK/prefix (the package
   must be relocatable). The installed tree must hold the public headers, gpufeed/version.h with
   the project's version, the shared libraries with SONAME libgpufeed_<room>.so.<major> and
   RUNPATH $ORIGIN, the CMake config, gpufeed.pc; it must not hold the internal headers, nor name
   the source tree, the build tree or torch's location in any text file.
2. examples/loader_only and examples/custom_trainer are configured and built from the prefix alone
   (CMAKE_PREFIX_PATH = prefix, plus torch's prefix for the trainer; the package registry off), and
   loader_only a second time with `c++ $(pkg-config --cflags --libs gpufeed)`. Times are printed.
3. On a `gpufeed make-dataset` dataset: both loader_only builds (2 and 1 workers) print, per epoch,
   the same batches, samples and checksum as reference_checksum, which decodes every sample alone
   with the build tree's libraries (load_sample); the epochs' checksums differ (reshuffled), and
   the example's HostAllocator gave the loader's 3 slots. custom_trainer runs as 2 DDP ranks under
   `gpufeed launch`: 3 epoch lines with the padded-and-dropped sample count, a loss that falls,
   and the same parameter checksum on both ranks.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

PUBLIC_HEADERS = [
    "gpufeed/loader.h", "gpufeed/torch.h", "gpufeed/version.h",
    "gpufeed/decode/decoder.h", "gpufeed/decode/error.h",
    "gpufeed/sampler/sampler.h", "gpufeed/sampler/randperm.h", "gpufeed/sampler/ra_sampler.h",
    "gpufeed/sampler/shard_order.h", "gpufeed/sampler/mixing.h",
    "gpufeed/transforms/augment.h", "gpufeed/loader/batch.h", "gpufeed/datasets/dataset.h", "gpufeed/loader/host_allocator.h",
    "gpufeed/loader/loader.h", "gpufeed/datasets/remote.h", "gpufeed/transforms/resize.h", "gpufeed/datasets/shards.h",
    "gpufeed/datasets/synthetic.h", "gpufeed/datasets/mixed.h",
    "gpufeed/loader/rank_sampler.h", "gpufeed/loader/thread_tuner.h",
    "gpufeed/transforms/transform.h", "gpufeed/prefetch/prefetcher.h",
    "gpufeed/device/cuda.h", "gpufeed/device/engine.h", "gpufeed/device/normalize.h", "gpufeed/profiler/atomic_file.h",
    "gpufeed/harness/amp.h", "gpufeed/harness/checkpoint.h", "gpufeed/harness/data_parallel.h",
    "gpufeed/harness/distributed.h", "gpufeed/harness/lr_schedule.h", "gpufeed/profiler/profiler.h",
    "gpufeed/profiler/progress.h", "gpufeed/harness/recipe.h", "gpufeed/harness/resnet.h", "gpufeed/harness/torch_file.h",
    "gpufeed/harness/train_checkpoint.h",
    "gpufeed/harness/trainer.h",
    # The sub-rooms' forwarding headers at their old paths (docs/API.md, "Header paths and namespaces").
    "gpufeed/loader/dataset.h", "gpufeed/loader/remote.h", "gpufeed/loader/shards.h", "gpufeed/loader/synthetic.h",
    "gpufeed/loader/augment.h", "gpufeed/loader/resize.h", "gpufeed/loader/transform.h",
    "gpufeed/harness/profiler.h", "gpufeed/harness/progress.h", "gpufeed/harness/atomic_file.h",
]
# pack/inspect.h belongs to gpufeed_inspect, the report `gpufeed inspect` and gpufeed.inspect()
# share: a library of the CLI and the Python package, not of the installed package; likewise
# pack/pack.h (gpufeed_pack, `gpufeed pack`). datasets/tbb_tsan.h is the loader rooms' oneTBB helper.
INTERNAL_HEADERS = ["gpufeed/log.h", "gpufeed/cpu_features.h", "gpufeed/glibc_libm.h", "gpufeed/log_text.h", "gpufeed/json_text.h", "gpufeed/unique_fd.h", "gpufeed/profiler/nvml.h", "gpufeed/profiler/trace.h",
                    "gpufeed/pack/inspect.h", "gpufeed/pack/pack.h", "gpufeed/datasets/tbb_tsan.h",
                    # The https client's CA search (remote_client.cpp and its test).
                    "gpufeed/datasets/ca_bundle.h",
                    # The reported structs' field lists, read by the fronts (Python, the CLI, the profiler).
                    "gpufeed/fields.h", "gpufeed/fields_json.h", "gpufeed/loader/stats_fields.h",
                    "gpufeed/datasets/remote_fields.h", "gpufeed/profiler/profile_fields.h"]
ROOMS = ["common", "decode", "sampler", "datasets", "transforms", "loader", "device", "prefetch", "profiler", "harness"]
EPOCH = re.compile(r"^epoch (\d+) batches (\d+) samples (\d+) checksum ([0-9a-f]{16})", re.M)


def fail(message):
    print(f"FAIL: {message}", flush=True)
    sys.exit(1)


def run(cmd, env=None, cwd=None):
    cmd = [str(c) for c in cmd]
    print("+ " + " ".join(cmd), flush=True)
    t0 = time.monotonic()
    r = subprocess.run(cmd, text=True, capture_output=True, env=env, cwd=cwd)
    seconds = time.monotonic() - t0
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        fail(f"exit code {r.returncode}: {' '.join(cmd)}")
    return r.stdout + r.stderr, seconds


def readelf_dynamic(path):
    out, _ = run(["readelf", "-d", path])
    soname = re.search(r"\(SONAME\).*\[(.*)\]", out)
    runpath = re.search(r"\((?:RUNPATH|RPATH)\).*\[(.*)\]", out)
    return (soname.group(1) if soname else None), (runpath.group(1) if runpath else None)


def check_install(a, prefix):
    major, minor, patch = a.version.split(".")
    lib = prefix / "lib"
    files = sorted(str(p.relative_to(prefix)) for p in prefix.rglob("*") if p.is_file() or p.is_symlink())
    print("installed:\n  " + "\n  ".join(files))
    for h in PUBLIC_HEADERS:
        if not (prefix / "include" / h).is_file():
            fail(f"public header {h} not installed")
    for h in INTERNAL_HEADERS:
        if (prefix / "include" / h).exists():
            fail(f"internal header {h} was installed")
    # Every header of a room's include/ (top-level rooms and their sub-rooms, such as
    # loader/datasets/) is either installed or named internal here: a new public header must be
    # added to its room's gpufeed_library(... HEADERS ...).
    source = Path(a.source)
    headers = [h for pattern in ("*/include/gpufeed/**/*.h", "*/*/include/gpufeed/**/*.h")
               for h in source.glob(pattern)
               if not h.relative_to(source).parts[0].startswith(("build", "."))]
    for header in sorted(headers):
        parts = header.relative_to(source).parts
        name = "/".join(parts[parts.index("include") + 1:])  # <room>[/<sub-room>]/include/<name>
        if name not in INTERNAL_HEADERS and not (prefix / "include" / name).is_file():
            fail(f"{header.relative_to(a.source)} is neither installed nor listed as internal")
    version_h = (prefix / "include/gpufeed/version.h").read_text()
    for name, value in (("MAJOR", major), ("MINOR", minor), ("PATCH", patch)):
        if not re.search(rf"#define GPUFEED_VERSION_{name} {value}\b", version_h):
            fail(f"version.h does not define GPUFEED_VERSION_{name} {value}")
    for room in ROOMS:
        real = lib / f"libgpufeed_{room}.so.{a.version}"
        if not real.is_file():
            fail(f"{real.name} not installed")
        soname, runpath = readelf_dynamic(real)
        if soname != f"libgpufeed_{room}.so.{major}":
            fail(f"{real.name}: SONAME {soname}, expected libgpufeed_{room}.so.{major}")
        if runpath != "$ORIGIN":
            fail(f"{real.name}: RUNPATH {runpath}, expected $ORIGIN")
        for link in (f"libgpufeed_{room}.so.{major}", f"libgpufeed_{room}.so"):
            if not (lib / link).is_symlink():
                fail(f"{link} is not a symlink")
    for f in ("lib/cmake/gpufeed/gpufeedConfig.cmake", "lib/cmake/gpufeed/gpufeedConfigVersion.cmake",
              "lib/cmake/gpufeed/gpufeed-core-targets.cmake", "lib/cmake/gpufeed/gpufeed-torch-targets.cmake",
              "lib/pkgconfig/gpufeed.pc"):
        if not (prefix / f).is_file():
            fail(f"{f} not installed")
    # SameMajorVersion: any request of this major version up to this version is compatible.
    probe = prefix.parent / "version_probe.cmake"
    probe.write_text(f'include("{prefix}/lib/cmake/gpufeed/gpufeedConfigVersion.cmake")\n'
                     'message("compatible=${PACKAGE_VERSION_COMPATIBLE}")\n')
    for request, expected in ((f"{major}.0", True), (a.version, True), (f"{int(major) + 1}.0", False),
                              (f"{major}.{int(minor) + 1}", False)):
        parts = (request.split(".") + ["0", "0"])[:3]
        out, _ = run([a.cmake, f"-DPACKAGE_FIND_VERSION={request}", f"-DPACKAGE_FIND_VERSION_MAJOR={parts[0]}",
                      f"-DPACKAGE_FIND_VERSION_MINOR={parts[1]}", f"-DPACKAGE_FIND_VERSION_PATCH={parts[2]}",
                      "-P", probe])
        if ("compatible=TRUE" in out) != expected:
            fail(f"gpufeedConfigVersion.cmake {a.version}: a request for {request} gives '{out.strip()}'")
    # Nothing of this machine's trees leaks into the package's text files.
    leaks = {"source tree": a.source, "build tree": a.build, "torch prefix": str(Path(a.torch_prefix).parents[1])}
    for f in files:
        p = prefix / f
        if p.is_symlink() or p.suffix not in (".cmake", ".pc", ".h"):
            continue
        text = p.read_text()
        for what, path in leaks.items():
            if path in text:
                fail(f"{f} names the {what} ({path})")


def configure_build(a, name, source, build, prefix_path):
    cmd = [a.cmake, "-S", source, "-B", build, "-G", a.generator, "-DCMAKE_BUILD_TYPE=Release",
           f"-DCMAKE_CXX_COMPILER={a.cxx}", f"-DCMAKE_C_COMPILER={a.c}",
           f"-DCMAKE_PREFIX_PATH={';'.join(str(p) for p in prefix_path)}",
           "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF"]
    _, configure_s = run(cmd)
    _, build_s = run([a.cmake, "--build", build])
    cache = (build / "CMakeCache.txt").read_text()
    found = re.search(r"^gpufeed_DIR:PATH=(.*)$", cache, re.M)
    if not found or Path(found.group(1)) != prefix_path[0] / "lib/cmake/gpufeed":
        fail(f"{name} found gpufeed at {found.group(1) if found else None}, not in the prefix")
    print(f"time: {name}: configure {configure_s:.1f} s, build {build_s:.1f} s", flush=True)
    return configure_s + build_s


def epochs_of(output, name):
    found = EPOCH.findall(output)
    if not found:
        fail(f"{name} printed no epoch line:\n{output}")
    return [tuple(e) for e in found]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for arg in ("build", "source", "work", "version", "gpufeed", "reference", "torch_prefix", "generator",
                "cmake", "cxx", "c"):
        p.add_argument("--" + arg.replace("_", "-"), required=True)
    a = p.parse_args()
    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    stage, prefix = work / "stage", work / "prefix"
    run([a.cmake, "--install", a.build, "--prefix", stage])
    stage.rename(prefix)
    check_install(a, prefix)

    examples = Path(a.source) / "examples"
    total = configure_build(a, "loader_only", examples / "loader_only", work / "loader_only", [prefix])
    total += configure_build(a, "custom_trainer", examples / "custom_trainer", work / "custom_trainer",
                             [prefix, Path(a.torch_prefix)])
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib/pkgconfig"))
    flags, _ = run(["pkg-config", "--cflags", "--libs", "gpufeed"], env=env)
    pc_binary = work / "loader_only_pc"
    _, pc_s = run([a.cxx, examples / "loader_only/main.cpp", *flags.split(), "-o", pc_binary], env=env)
    print(f"time: loader_only with pkg-config ({flags.strip()}): build {pc_s:.1f} s")
    print(f"time: both examples, configure + build: {total:.1f} s", flush=True)

    data = work / "data"
    run([a.gpufeed, "make-dataset", "--out", data, "--classes", "4", "--per-class", "24",
         "--min-size", "48", "--max-size", "96", "--seed", "3"])

    # loader_only, rank 1 of 2, against the build tree's per-sample reference.
    args = ["--epochs", "2", "--batch-size", "10", "--image-size", "40", "--seed", "7", "--rank", "1",
            "--world-size", "2"]
    reference, _ = run([a.reference, data, *args])
    want = epochs_of(reference, "reference_checksum")
    print(reference, end="")
    if len(want) != 2 or want[0][3] == want[1][3]:
        fail(f"reference: expected 2 epochs with different checksums: {want}")
    if want[0][1:3] != ("5", "48"):
        fail(f"reference: expected 5 batches of 48 samples per epoch (rank 1 of 2, 96 files): {want[0]}")
    # The examples load gpufeed from the prefix and find every library they need (LibTorch's
    # too: the installed libraries' RUNPATH is $ORIGIN alone).
    for binary, lib in (("loader_only/loader_only", "loader"), ("custom_trainer/custom_trainer", "harness")):
        ldd, _ = run(["ldd", work / binary])
        if "not found" in ldd or not re.search(rf"libgpufeed_{lib}\.so\.\d+ => {re.escape(str(prefix / 'lib'))}/", ldd):
            fail(f"{binary} does not load libgpufeed_{lib} from the prefix, or misses a library:\n{ldd}")
    lib_env = dict(os.environ, LD_LIBRARY_PATH=str(prefix / "lib"))
    for binary, workers, env in ((work / "loader_only/loader_only", "2", None), (pc_binary, "1", lib_env)):
        out, _ = run([binary, data, *args, "--num-workers", workers], env=env)
        print(out, end="")
        if epochs_of(out, binary.name) != want:
            fail(f"{binary} (workers {workers}) differs from reference_checksum")
        if "allocator: 3 slots" not in out:
            fail(f"{binary}: the example's HostAllocator did not give the loader's 3 slots")

    # custom_trainer: 2 ranks (Gloo) under gpufeed launch.
    out, train_s = run([a.gpufeed, "launch", "--nproc-per-node", "2", "--master-port", "0", "--",
                        work / "custom_trainer/custom_trainer", data, "--epochs", "3", "--batch-size", "16",
                        "--image-size", "32", "--num-workers", "1", "--lr", "0.2"])
    print(out, end="")
    epochs = re.findall(r"^epoch (\d+): loss ([0-9.]+) top1 ([0-9.]+) samples (\d+) images/s ([0-9.]+) "
                        r"data wait ([0-9.]+)%", out, re.M)
    if [e[0] for e in epochs] != ["0", "1", "2"]:
        fail(f"custom_trainer: expected epoch lines 0, 1, 2 from rank 0, got {epochs}")
    # 96 files, 2 ranks: 48 each, 3 full batches of 16 (drop_last), 96 samples per epoch.
    if any(e[3] != "96" for e in epochs):
        fail(f"custom_trainer: expected 96 samples per epoch: {epochs}")
    if not float(epochs[-1][1]) < float(epochs[0][1]):
        fail(f"custom_trainer: the loss did not fall: {epochs}")
    sums = dict(re.findall(r"^rank (\d): parameter checksum (\S+)$", out, re.M))
    if sorted(sums) != ["0", "1"] or sums["0"] != sums["1"]:
        fail(f"custom_trainer: the ranks' parameters differ after DDP training: {sums}")
    print(f"time: custom_trainer, 2 ranks x 3 epochs: {train_s:.1f} s")
    print("package: OK")


if __name__ == "__main__":
    main()
