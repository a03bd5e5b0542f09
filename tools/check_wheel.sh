#!/usr/bin/env bash
# The wheel in the environments users have: builds and repairs the wheels (tools/build_wheel.sh),
# checks that gpufeed._C and the libraries the wheel carries need nothing outside the wheel but
# glibc and the C++ runtime (readelf), then, per case torch@python, makes a venv with that torch
# release from PyPI (and the test dependencies), installs the wheel there with plain
# `pip install`, and runs the pytest suite against it (goldens from that venv's torchvision).
# Prints the matrix; exits 1 if any case failed.
#   tools/check_wheel.sh                 the matrix below (downloads torch: several GB per case)
#   tools/check_wheel.sh --pinned        CI's case (ctest wheel_pinned_torch): the .venv's CPython and
#                                        torch (the project's pin), no download; the suite runs with
#                                        Debian's image, oneTBB, spdlog and fmt libraries hidden (each
#                                        bind-mounted over by /dev/null in a private mount namespace)
#   GPUFEED_WHEEL_CASES="2.15.0@3.12 ..." the cases (torch version @ CPython version)
#   GPUFEED_WHEEL_VENVS=DIR              where the venvs are kept and reused (default build/wheel/venvs)
#   GPUFEED_WHEEL=FILE.whl               --pinned: test this wheel (e.g. a manylinux_2_28 one of
#                                        tools/wheel/build_zig_wheel.sh) instead of building one
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODE=${1:-matrix}
CASES=${GPUFEED_WHEEL_CASES:-"2.11.0@3.11 2.13.0@3.13 2.15.0@3.12"}
VENVS=${GPUFEED_WHEEL_VENVS:-build/wheel/venvs}
DIST=build/wheel/dist
mkdir -p build/wheel
TEST_DEPS=(pillow numpy matplotlib pytest "webdataset==1.0.2" "torchdata==0.11.0" "moto[server]==5.2.5")

find_python() {  # a CPython X.Y that runs: the .venv's, python3.Y on PATH, or pyenv's
  local v=$1 c
  for c in .venv/bin/python "$(command -v "python$v" 2>/dev/null)" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/python"$v"; do
    if [ -n "$c" ] && [ -x "$c" ] && [ "$("$c" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$v" ]; then
      echo "$c"; return
    fi
  done
}

torchvision_for() {  # torchvision's release for torch 2.N is 0.(N+15); pip picks one for torch releases past the newest
  local minor
  minor=$(echo "$1" | cut -d. -f2)
  if [ "$minor" -le 14 ]; then echo "torchvision==0.$((minor + 15)).*"; else echo torchvision; fi
}

check_needed() {  # every NEEDED of _C and of the bundled libraries: glibc, the C++ runtime, zlib or in the wheel
  .venv/bin/python - "$1" <<'PY'
import pathlib, re, subprocess, sys, tempfile, zipfile
SYSTEM = {"libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libpthread.so.0", "libdl.so.2",
          "librt.so.1", "ld-linux-x86-64.so.2", "libz.so.1", "libresolv.so.2", "libnsl.so.1",
          "libutil.so.1"}  # glibc and the rest of the manylinux policy's own list (zlib; libresolv for libcurl's Kerberos)
wheel = sys.argv[1]
with tempfile.TemporaryDirectory() as d:
    zipfile.ZipFile(wheel).extractall(d)
    root = pathlib.Path(d)
    ext = sorted(root.glob("gpufeed/_C*.so"))
    bundled = sorted(root.glob("gpufeed.libs/*.so*"))
    if len(ext) != 1:
        sys.exit(f"check_wheel: {wheel}: expected one gpufeed/_C*.so, found {[p.name for p in ext]}")
    names = {p.name for p in bundled}
    bad = []
    for lib in ext + bundled:
        out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
        for needed in re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out):
            if needed not in SYSTEM and needed not in names:
                bad.append(f"{lib.relative_to(root)} needs {needed}")
            if re.match(r"lib(torch|c10|gpufeed)", needed):
                bad.append(f"{lib.relative_to(root)} needs {needed} (LibTorch or gpufeed's own libraries)")
    if bad:
        sys.exit("check_wheel: " + wheel + ": needs libraries outside the wheel:\n  " + "\n  ".join(bad))
    print(f"check_wheel: {pathlib.Path(wheel).name}: _C needs only glibc, the C++ runtime and "
          f"{len(bundled)} libraries in gpufeed.libs/: {', '.join(sorted(n.split('-')[0] for n in names))}")
PY
}

run_suite() {  # venv python [cli]: the pytest suite against the installed wheel, from outside the checkout
  local py=$1
  local cli=(GPUFEED_CLI="${2-$ROOT/build/release/tools/gpufeed}")  # empty: its tests skip
  (cd "$(mktemp -d)" && env -u PYTHONPATH "${cli[@]}" GPUFEED_SHARED_DIR="${GPUFEED_SHARED_DIR:-$ROOT/../shared}" \
     "$py" -m pytest -q -p no:cacheprovider -rs "$ROOT/python/tests")
}

wheel_for() {  # the wheel that installs into CPython X.Y
  local v=${1/./}
  if [ "$v" -ge 312 ]; then ls "$DIST"/gpufeed-*-cp312-abi3-*.whl; else ls "$DIST"/gpufeed-*-cp"$v"-cp"$v"-*.whl; fi | tail -1
}

if [ "$MODE" = "--pinned" ]; then
  if [ -n "${GPUFEED_WHEEL:-}" ]; then
    whl=$(realpath "$GPUFEED_WHEEL")
    echo "check_wheel: testing the prebuilt $whl"
  else
    ./tools/build_wheel.sh --out "$DIST" .venv/bin/python | tee build/wheel/built.txt
    whl=$(wheel_for "$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')")
  fi
  check_needed "$whl"
  venv=build/wheel/venv-pinned
  rm -rf "$venv"
  "$(.venv/bin/python -c 'import sys; print(sys._base_executable)')" -m venv "$venv"
  # The .venv's torch (the pin) and test dependencies, after the venv's own site-packages: the
  # wheel's gpufeed shadows the one setup.sh installed into .venv.
  site=$("$venv"/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  .venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))' > "$site/zz_gpufeed_venv.pth"
  "$venv"/bin/python -m pip install -q --no-index --no-deps --ignore-installed "$whl"  # beside, not over, .venv's
  "$venv"/bin/python -c 'import gpufeed, sys; p = gpufeed.__file__; assert "/venv-pinned/" in p, p; print("check_wheel: gpufeed from", p)'
  hidden=$(ls /usr/lib/x86_64-linux-gnu/{libjpeg,libturbojpeg,libpng16,libwebp,libsharpyuv,libgif,libtiff,libtbb,libspdlog,libfmt,libcurl}.so* 2>/dev/null || true)
  if unshare -rm true 2>/dev/null; then
    echo "check_wheel: hiding $(echo "$hidden" | wc -w) Debian library files for the suite"
    export -f run_suite
    ROOT=$ROOT unshare -rm bash -c 'set -e; for f in '"$(echo $hidden)"'; do mount --bind /dev/null "$f"; done
      "$1" -c "import ctypes; ctypes.CDLL(\"libjpeg.so.62\")" 2>/dev/null && { echo "check_wheel: libjpeg.so.62 still loads"; exit 1; }
      run_suite "$1" ""' _ "$ROOT/$venv/bin/python"
  else
    echo "check_wheel: no private mount namespace here (unshare -rm failed): checking where the libraries load from instead"
    LD_DEBUG=files "$venv"/bin/python -c "import gpufeed" 2>&1 | grep -E "calling init: .*/($(echo "$hidden" | xargs -n1 basename | sed 's/[.]so.*//' | sort -u | paste -sd'|'))" \
      && { echo "check_wheel: gpufeed loaded a Debian library"; exit 1; }
    run_suite "$ROOT/$venv/bin/python"
  fi
  exit 0
fi

# The matrix.
declare -A WANT=()
for c in $CASES; do WANT[${c#*@}]=1; done
PYS=()
for v in "${!WANT[@]}"; do
  p=$(find_python "$v")
  [ -n "$p" ] || { echo "check_wheel: no CPython $v on this machine" >&2; exit 2; }
  # 3.12 and later share the abi3 wheel: build it once, with the oldest of them
  PYS+=("$v $p")
done
builds=()
abi3_built=0
for entry in $(printf '%s\n' "${PYS[@]}" | sort -V | tr ' ' '|'); do
  v=${entry%%|*}; p=${entry#*|}
  if [ "${v/./}" -ge 312 ]; then [ $abi3_built = 1 ] && continue; abi3_built=1; fi
  builds+=("$p")
done
rm -f "$DIST"/gpufeed-*.whl
./tools/build_wheel.sh --out "$DIST" "${builds[@]}" | tee build/wheel/built.txt
for whl in "$DIST"/gpufeed-*.whl; do check_needed "$whl"; done

declare -A RESULT=()
for c in $CASES; do
  t=${c%@*}; v=${c#*@}
  venv=$(realpath -m "$VENVS/torch$t-py$v")
  p=$(find_python "$v")
  if [ ! -x "$venv/bin/python" ]; then
    "$p" -m venv "$venv"
  fi
  if ! "$venv/bin/python" -c "import torch, torchvision, matplotlib, pytest, webdataset, torchdata; assert torch.__version__.split('+')[0] == '$t'" 2>/dev/null; then
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q "torch==$t" "$(torchvision_for "$t")" "${TEST_DEPS[@]}"
  fi
  whl=$(wheel_for "$v")
  "$venv/bin/pip" uninstall -q -y gpufeed 2>/dev/null || true
  "$venv/bin/pip" install -q "$whl"
  if run_suite "$venv/bin/python" 2>&1 | tee "build/wheel/pytest-torch$t-py$v.log" | tail -3; [ "${PIPESTATUS[0]}" -eq 0 ]; then
    RESULT[$c]="passed ($(tail -1 "build/wheel/pytest-torch$t-py$v.log" | sed 's/=//g; s/^ *//; s/ *$//'))"
  else
    RESULT[$c]="FAILED (build/wheel/pytest-torch$t-py$v.log)"
  fi
done
echo
echo "| torch | CPython | wheel | pytest |"
echo "|---|---|---|---|"
status=0
for c in $CASES; do
  t=${c%@*}; v=${c#*@}
  echo "| $t | $v | $(basename "$(wheel_for "$v")") | ${RESULT[$c]} |"
  case "${RESULT[$c]}" in FAILED*) status=1 ;; esac
done
exit $status
