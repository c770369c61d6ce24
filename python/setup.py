"""Build the chainps extension (chainps._chainps, src/*.c) against libchainps for pip.

Where libchainps comes from, first match wins:
  CHAINPS_BUILD_DIR=DIR   a CMake build tree of this repository (DIR/libchainps.so, headers
                          from the source tree beside this folder): for developers.
  pkg-config chainps      an installed libchainps (`cmake --install BUILD --prefix P` puts
                          P/lib/pkgconfig/chainps.pc there; PKG_CONFIG_PATH=P/lib/pkgconfig
                          finds one outside the default search path).
The extension gets an RPATH to the library's directory (unless it is a system one), so it
imports without LD_LIBRARY_PATH. The package's version is CHAINPS_VERSION_* of the chainps.h it
is compiled against, so the two cannot disagree.

Offline (no PyPI): pip install --no-build-isolation ./python
              or: pip wheel --no-build-isolation --no-deps -w dist ./python
"""

import os
import re
import shlex
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_INCLUDE = os.path.join(os.path.dirname(HERE), "include")


def fail(msg):
    sys.stderr.write(f"chainps setup.py: {msg}\n")
    sys.exit(1)


def pkg_config(*args):
    try:
        out = subprocess.run(["pkg-config", *args, "chainps"], check=True, capture_output=True,
                             text=True).stdout
    except FileNotFoundError:
        fail("pkg-config is not installed (Debian: apt-get install pkg-config), and "
             "CHAINPS_BUILD_DIR is not set")
    except subprocess.CalledProcessError as e:
        fail("libchainps not found: pkg-config says: " + e.stderr.strip() + "\n  Install it "
             "(cmake --install BUILD --prefix P, then PKG_CONFIG_PATH=P/lib/pkgconfig), or set "
             "CHAINPS_BUILD_DIR to a CMake build directory of chainps")
    return out.strip()


def from_build_dir(build):
    build = os.path.abspath(build)
    if not os.path.exists(os.path.join(build, "libchainps.so")):
        fail(f"CHAINPS_BUILD_DIR={build} holds no libchainps.so (build it first: "
             f"cmake --build {build})")
    if not os.path.exists(os.path.join(SOURCE_INCLUDE, "chainps", "chainps.h")):
        fail(f"CHAINPS_BUILD_DIR needs the source tree's headers in {SOURCE_INCLUDE}")
    return [SOURCE_INCLUDE], [build], ["chainps"], []


def from_pkg_config():
    incs, libdirs, libs, other = [], [], [], []
    for flag in shlex.split(pkg_config("--cflags", "--libs")):
        if flag.startswith("-I"):
            incs.append(flag[2:])
        elif flag.startswith("-L"):
            libdirs.append(flag[2:])
        elif flag.startswith("-l"):
            libs.append(flag[2:])
        else:
            other.append(flag)
    # -I of a system directory is dropped by pkg-config: the header is then the system one.
    incs = incs or [pkg_config("--variable=includedir")]
    return [os.path.realpath(d) for d in incs], libdirs, libs, other


def version(include_dirs):
    for d in include_dirs:
        path = os.path.join(d, "chainps", "chainps.h")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            parts = [re.search(rf"#define\s+CHAINPS_VERSION_{p}\s+(\d+)", text)
                     for p in ("MAJOR", "MINOR", "PATCH")]
            if all(parts):
                return ".".join(m.group(1) for m in parts)
            fail(f"{path} has no CHAINPS_VERSION_MAJOR/MINOR/PATCH")
    fail(f"chainps/chainps.h not found in {include_dirs}")


def system_dir(d):
    return os.path.realpath(d) in ("/lib", "/usr/lib", "/lib64", "/usr/lib64") or \
        re.fullmatch(r"/(usr/)?lib/[a-z0-9_]+-linux-gnu[a-z0-9_]*", os.path.realpath(d))


class BuildExt(build_ext):
    """Always compile: pip builds in this folder (build/), and an extension left there by a build
    against another libchainps would be reused as it is, RPATH and all, since the sources did
    not change."""

    def finalize_options(self):
        super().finalize_options()
        self.force = True


build_dir = os.environ.get("CHAINPS_BUILD_DIR")
inc, libdirs, libs, extra = from_build_dir(build_dir) if build_dir else from_pkg_config()
libdirs = [os.path.realpath(d) for d in libdirs]
rpath = [d for d in libdirs if not system_dir(d)]

setup(
    version=version(inc),
    packages=["chainps"],  # here, not in pyproject.toml: setuptools 66 calls that beta
    cmdclass={"build_ext": BuildExt},
    ext_modules=[Extension(
        "chainps._chainps",
        sources=sorted(os.path.join("src", f) for f in os.listdir(os.path.join(HERE, "src"))
                       if f.endswith(".c")),
        include_dirs=["src", *inc],
        library_dirs=libdirs,
        libraries=libs,
        runtime_library_dirs=rpath,
        extra_compile_args=["-std=c11", *extra],
    )],
)
