"""Builds libringleader (the Rust C ABI in ../) with cargo and ships it
inside the package, so `pip install ./ffi/python` works on a machine with a
Rust toolchain and nothing else prepared.

It compiles ringleader/_native.c, the numpy API's blocking calls and the
call-site capture in C (CPython 3.11 and later with the GIL; a second or
so). That extension is optional too: without a C compiler, or with
RINGLEADER_NATIVE_BUILD=0, the package installs without it and runs those
paths through ctypes (ringleader.NATIVE_LANE says which).

Where torch is importable at build time (pip's --no-build-isolation, or
torch in the build environment), it also compiles the torch backend's C++
lane, ringleader/_torch_native.cpp, against that torch (about 35 s). That
extension is optional: without a C++20 compiler, or with
RINGLEADER_TORCH_NATIVE_BUILD=0, the package installs without it and the
torch backend runs in Python alone (ringleader.torch.NATIVE says which).
It is built for that torch only; under another torch it does not load, and
the backend says why in ringleader.torch.NATIVE_MISSING.

Environment:
  CARGO               cargo to run (default: cargo on PATH)
  CARGO_TARGET_DIR    honoured, as cargo does
  RINGLEADER_PREBUILT path to an already built libringleader.so to ship
                      instead of building (for packagers)
  RINGLEADER_NATIVE_BUILD
                      0: do not build ringleader/_native.c
  RINGLEADER_TORCH_NATIVE_BUILD
                      0: do not build the torch backend's C++ lane
"""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
CRATE = HERE.parent  # ffi/
LIB = "libringleader.so"


def _workspace_target_dir() -> Path:
    if os.environ.get("CARGO_TARGET_DIR"):
        return Path(os.environ["CARGO_TARGET_DIR"])
    out = subprocess.run(
        [os.environ.get("CARGO", "cargo"), "metadata", "--format-version", "1", "--no-deps"],
        cwd=CRATE, check=True, capture_output=True, text=True,
    ).stdout
    import json

    return Path(json.loads(out)["target_directory"])


def _build_library() -> Path:
    prebuilt = os.environ.get("RINGLEADER_PREBUILT")
    if prebuilt:
        return Path(prebuilt)
    cargo = os.environ.get("CARGO", "cargo")
    if shutil.which(cargo) is None:
        raise SystemExit(
            "building ringleader needs a Rust toolchain: `cargo` was not found on PATH "
            "(install it from https://rustup.rs, or set RINGLEADER_PREBUILT to a built libringleader.so)"
        )
    subprocess.run([cargo, "build", "--release", "-p", "ringleader-ffi"], cwd=CRATE, check=True)
    lib = _workspace_target_dir() / "release" / LIB
    if not lib.exists():
        raise SystemExit(f"cargo finished but {lib} is missing")
    return lib


class BuildWithCargo(build_py):
    """build_py that first builds libringleader.so and copies it into the package."""

    def run(self):
        lib = _build_library()
        super().run()
        dest = Path(self.build_lib) / "ringleader" / LIB
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, dest)


class BinaryDistribution(Distribution):
    """The wheel holds a native library: tag it for this platform."""

    def has_ext_modules(self):
        return True


try:
    from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel
except ImportError:  # pragma: no cover - setuptools < 70.1
    try:
        from wheel.bdist_wheel import bdist_wheel as _bdist_wheel
    except ImportError:
        _bdist_wheel = None

def _torch_extension():
    """(extension, build_ext class) for the torch backend's C++ lane, or
    (None, None) where it is not to be built."""
    if os.environ.get("RINGLEADER_TORCH_NATIVE_BUILD", "1") == "0":
        return None, None
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        return None, None

    class OptionalBuildExtension(BuildExtension):
        """The lane is an optimisation: a failed compile leaves the package
        without it (and says so), never without a package."""

        def run(self):
            try:
                super().run()
            except Exception as e:  # noqa: BLE001 (any compiler failure)
                print(f"warning: the package's compiled extensions did not build ({e}); "
                      "the torch backend will run in Python alone, the numpy API through ctypes", flush=True)

        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except Exception as e:  # noqa: BLE001
                what = "the torch backend will run in Python alone" if ext.name.endswith("_torch_native") else \
                    "the numpy API runs through ctypes"
                print(f"warning: {ext.name} did not build ({e}); {what}", flush=True)

    ext = CppExtension(
        "ringleader._torch_native",
        ["ringleader/_torch_native.cpp"],
        include_dirs=[str(CRATE / "include")],
        extra_compile_args=["-O2", "-std=c++20"],
    )
    return ext, OptionalBuildExtension


def _native_extension():
    """The C lane (ringleader/_native.c), or None where it is not to be
    built: asked not to, an interpreter before 3.11 (no PyFrame_GetLasti)
    or one without the GIL (its borrowed dictionary lookups need it)."""
    if os.environ.get("RINGLEADER_NATIVE_BUILD", "1") == "0":
        return None
    if sys.implementation.name != "cpython" or sys.version_info < (3, 11):
        return None
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return None
    from setuptools import Extension

    # optional: a failed compile leaves the package without the lane.
    # -std given, so that torch's build_ext (when it builds both) adds no
    # C++ standard to a C file.
    return Extension(
        "ringleader._native",
        ["ringleader/_native.c"],
        include_dirs=[str(CRATE / "include")],
        extra_compile_args=["-O2", "-std=gnu11"],
        optional=True,
    )


cmdclass = {"build_py": BuildWithCargo}
_ext, _build_ext = _torch_extension()
if _ext is not None:
    cmdclass["build_ext"] = _build_ext
_native = _native_extension()
_extensions = [e for e in (_native, _ext) if e is not None]
if _bdist_wheel is not None:

    class BdistWheel(_bdist_wheel):
        """Platform wheel; without compiled extensions independent of the
        Python version (ctypes only), with them tagged for this Python."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            py, abi, plat = super().get_tag()
            if _extensions:
                return py, abi, plat
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = BdistWheel

setup(cmdclass=cmdclass, distclass=BinaryDistribution, ext_modules=_extensions)
