#!/bin/sh
# Install the build into a temporary prefix and use it as an outside project would: a C program
# built with pkg-config (shared and static), a CMake project with find_package(chainps), each
# run in a real job started by the INSTALLED `chainps launch`; the installed library exports
# only cps_ functions; the installed Python package imports with the installed library; pip
# builds and installs the package from python/ against the installed library, into a venv.
# usage: test_install.sh BUILD_DIR SOURCE_DIR [python]   ("python": the build made the package)
set -eu
build=$1
src=$2
want_python=${3:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/chainps-install-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
p=$tmp/prefix
cmake --install "$build" --prefix "$p" >/dev/null
for f in bin/chainps include/chainps/chainps.h include/chainps/error.h include/chainps/export.h \
    lib/libchainps.so lib/libchainps.a lib/pkgconfig/chainps.pc \
    lib/cmake/chainps/chainpsConfig.cmake lib/cmake/chainps/chainpsConfigVersion.cmake; do
    [ -e "$p/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
other=$(nm -D --defined-only "$p/lib/libchainps.so" | awk '$2 == "T" && $3 !~ /^cps_/ {print $3}')
[ -z "$other" ] || { echo "FAIL: libchainps.so exports non-cps_ symbols: $other"; exit 1; }
internal=$(nm -D --defined-only "$p/lib/libchainps.so" | awk '$3 ~ /^cps__/ {print $3}')
[ -z "$internal" ] || { echo "FAIL: internal symbols exported: $internal"; exit 1; }
echo "libchainps.so exports $(nm -D --defined-only "$p/lib/libchainps.so" | grep -c ' T ') functions"

export PKG_CONFIG_PATH=$p/lib/pkgconfig
cc -std=c11 -Wall -Wextra -Werror -o "$tmp/consumer_pc" "$src/tests/install/consumer.c" \
    $(pkg-config --cflags --libs chainps) -Wl,-rpath,"$p/lib"
cc -std=c11 -Wall -Wextra -Werror -o "$tmp/consumer_pc_static" "$src/tests/install/consumer.c" \
    $(pkg-config --cflags chainps) "$p/lib/libchainps.a" $(pkg-config --libs --static chainps | sed 's/-lchainps//')
cmake -S "$src/tests/install/cmake_consumer" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$p" >/dev/null
cmake --build "$tmp/cm" >/dev/null
ldd "$tmp/cm/consumer_shared" | grep -q "$p/lib/libchainps.so" ||
    { echo "FAIL: the CMake consumer does not run on the installed library"; ldd "$tmp/cm/consumer_shared"; exit 1; }

for prog in "$tmp/consumer_pc" "$tmp/consumer_pc_static" "$tmp/cm/consumer_shared" "$tmp/cm/consumer_static"; do
    out=$(cd "$tmp" && timeout 120 "$p/bin/chainps" launch --servers 1 --workers 1 --timeout 100 -- "$prog" 2>&1) || {
        echo "$out" | tail -20; echo "FAIL: $prog in a job"; exit 1; }
    echo "$out" | grep -q "consumer ok" || { echo "$out" | tail -20; echo "FAIL: $prog"; exit 1; }
    echo "ok: $(basename "$prog") in a job started by the installed chainps"
done

# The Python package is part of the install whenever the build made it (CMake says so: python/
# is built when python3-dev is there): missing from the prefix is a failure, not a skip (it once
# went to PREFIX/python3/dist-packages, and this test passed without it).
py=$p/lib/python3.$(/usr/bin/python3 -c 'import sys; print(sys.version_info[1])')/dist-packages
if [ "$want_python" = python ]; then
    [ -f "$py/chainps/__init__.py" ] || {
        echo "FAIL: the Python package is not installed in $py"
        find "$p" -name '__init__.py' | head -5
        exit 1
    }
    # Debian's python3 (the one the package is built for), from outside the source and build
    # trees, so that only the installed package can be the one imported.
    where=$(cd "$tmp" && PYTHONPATH=$py /usr/bin/python3 -c \
        'import chainps; print(chainps.__file__, chainps.__version__)') ||
        { echo "FAIL: the installed Python package does not import"; exit 1; }
    case $where in
    "$py/chainps/"*) echo "python package: $where" ;;
    *) echo "FAIL: imported $where, not the installed package in $py"; exit 1 ;;
    esac
fi
# pip, as a Python user installs it (python/README.md): the package built by pip from python/
# against the INSTALLED libchainps (pkg-config finds P's chainps.pc) into a venv that sees
# Debian's numpy and torch; offline (--no-index: never waits on a registry; no build isolation:
# Debian's setuptools and wheel build it). `pip wheel`, then `pip install` of that wheel: both
# commands. From a copy of python/ holding only what pip needs: pip builds in the folder it is
# given, and the pkg-config build must not need the rest of the source tree.
if [ "$want_python" = python ]; then
    fail_log() { tail -30 "$1"; echo "FAIL: $2"; exit 1; }
    venv=$tmp/venv
    /usr/bin/python3 -c 'import setuptools, wheel' 2>/dev/null ||
        { echo "FAIL: python3-setuptools or python3-wheel is missing (scripts/deps.sh test)"
          exit 1; }
    timeout 120 /usr/bin/python3 -m venv --system-site-packages "$venv" >"$tmp/venv.log" 2>&1 ||
        fail_log "$tmp/venv.log" "python3 -m venv --system-site-packages (python3-venv?)"
    mkdir "$tmp/pysrc"
    cp -r "$src/python/pyproject.toml" "$src/python/setup.py" "$src/python/README.md" \
        "$src/python/chainps" "$src/python/src" "$tmp/pysrc/" ||
        { echo "FAIL: python/ lacks what pip builds from"; exit 1; }
    pipenv="PKG_CONFIG_PATH=$p/lib/pkgconfig PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1"
    env $pipenv timeout 240 "$venv/bin/pip" wheel --no-index --no-build-isolation --no-deps \
        -w "$tmp/wheels" "$tmp/pysrc" >"$tmp/pip.log" 2>&1 ||
        fail_log "$tmp/pip.log" "pip wheel of python/ against the installed libchainps"
    ver=$(sed -n 's/^#define CHAINPS_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' \
        "$p/include/chainps/chainps.h" | paste -sd.)
    whl=$(ls "$tmp/wheels"/chainps-"$ver"-*.whl 2>/dev/null) ||
        { ls "$tmp/wheels"; echo "FAIL: no wheel chainps-$ver-*.whl (the library's version)"
          exit 1; }
    env $pipenv timeout 120 "$venv/bin/pip" install --no-index "$whl" >>"$tmp/pip.log" 2>&1 ||
        fail_log "$tmp/pip.log" "pip install of the wheel (numpy from Debian?)"
    # A real call into the library: the version, init_values, and an error that says why.
    got=$(cd "$tmp" && env -u CHAINPS_SECRET_FILE -u CHAINPS_INSECURE CHAINPS_ROLE=worker \
        CHAINPS_SCHEDULER=127.0.0.1:9 timeout 60 "$venv/bin/python" -c '
import chainps
assert list(chainps.init_values(chainps.Init.constant(2.5), 0, 3)) == [2.5] * 3
try:
    chainps.init()
except chainps.Error as e:
    assert e.code == chainps.CPS_ECONFIG and "CHAINPS_SECRET_FILE" in str(e), str(e)
else:
    raise SystemExit("chainps.init() joined without a job secret")
print(chainps.__version__, chainps.__file__)' 2>"$tmp/py.err") ||
        fail_log "$tmp/py.err" "the pip-installed package does not work"
    case $got in
    "$ver $venv/"*) echo "pip-installed package: $got" ;;
    *) echo "FAIL: expected version $ver from $venv, got: $got"; exit 1 ;;
    esac
    out=$(cd "$tmp" && CONSUMER_VENV=$venv timeout 120 "$p/bin/chainps" launch --servers 1 \
        --workers 1 --timeout 100 -- "$venv/bin/python" "$src/tests/install/consumer.py" 2>&1) ||
        { echo "$out" | tail -20; echo "FAIL: the pip-installed package in a job"; exit 1; }
    echo "$out" | grep -q "python consumer ok" ||
        { echo "$out" | tail -20; echo "FAIL: consumer.py"; exit 1; }
    echo "ok: consumer.py in a job, with the package pip installed in a venv"
fi
echo "PASS: installed prefix works with pkg-config, find_package, Python and pip"
