"""reservoir.torch's native part: PyTorch's pluggable allocator completed, built
against the installed PyTorch.

    python3 -m reservoir._torch_native          # build now (else install() builds it)

What and why: _native/torch_native_allocator.cpp subclasses PyTorch's
CUDAPluggableAllocator with what its interface does not forward: cacheInfo (so
torch.backends.cudnn.benchmark = True works; without it every convolution fails
with "CUDAPluggableAllocator does not yet support cacheInfo"), the checkpoint
calls of torch.compile's cudagraph trees (answered in C++, so PyTorch's own
restore gives live storages their deleter), and allocation without the
pluggable's map of live pointers. A C++ virtual can only be overridden by C++
compiled against the same PyTorch, so install() compiles it on first use with
the system's C++ compiler (CXX, else c++ / g++), PyTorch's bundled headers,
CUDA's runtime headers and libreservoir.so's own (reservoir.h and the PyTorch
hooks' header: bundled into the package, else from the checkout), and caches
the library in RESERVOIR_CACHE_DIR (default ~/.cache/reservoir), keyed by the
source and those headers, PyTorch's version and library folder, and
libreservoir.so's path: about 8 s once on an H200 host, then a load.
RESERVOIR_TORCH_NATIVE=0 skips it. Where it cannot be built (no compiler, no
CUDA headers, no library headers), install() goes on with the plain pluggable
allocator and warns.
"""

import ctypes
import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

from . import _lib

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "_native", "torch_native_allocator.cpp")
# Headers of the native part beside SOURCE (its memory history).
LOCAL_HEADERS = sorted(glob.glob(os.path.join(HERE, "_native", "*.hpp")))
# The library's headers SOURCE includes, as paths under an include folder: in an
# installed package under _native/include (python/setup.py bundles them), in a
# checkout under include/ and src/.
HEADERS = ("reservoir/reservoir.h", "integrations/torch_hooks.hpp")
BUNDLED_INCLUDE = os.path.join(HERE, "_native", "include")

_state = {"library": None, "active": False, "reason": None}


class NativeBuildError(RuntimeError):
    """The native part could not be built; the message says what is missing."""


def enabled():
    return os.environ.get("RESERVOIR_TORCH_NATIVE", "1").strip().lower() not in ("0", "off", "no",
                                                                                "false")


def cache_dir():
    explicit = os.environ.get("RESERVOIR_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "reservoir")


def _compiler():
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise NativeBuildError("no C++ compiler found (set CXX, or install g++)")


def _cuda_include_dirs(torch):
    """Folders holding cuda_runtime_api.h: PyTorch's CUDA home, the pip CUDA runtime
    packages beside PyTorch, CUDA_HOME / CUDA_PATH, /usr/local/cuda."""
    roots = []
    try:
        from torch.utils import cpp_extension

        if cpp_extension.CUDA_HOME:
            roots.append(os.path.join(cpp_extension.CUDA_HOME, "include"))
    except Exception:  # cpp_extension's import can fail where no CUDA toolkit is
        pass
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(variable):
            roots.append(os.path.join(os.environ[variable], "include"))
    site = os.path.dirname(os.path.dirname(torch.__file__))
    roots += sorted(glob.glob(os.path.join(site, "nvidia", "**", "include"), recursive=True))
    roots.append("/usr/local/cuda/include")
    for root in roots:
        if os.path.exists(os.path.join(root, "cuda_runtime_api.h")):
            return [root]
    raise NativeBuildError("no CUDA runtime headers (cuda_runtime_api.h) found in %s; set "
                           "CUDA_HOME to a CUDA toolkit" % ", ".join(roots))


def include_dirs(bundled=None, root=None):
    """The folders to compile SOURCE with, where every one of HEADERS is found: the
    copies bundled into the package (BUNDLED_INCLUDE), else include/ and src/ of
    the checkout the package runs from (root: python/reservoir/ two levels up)."""
    bundled = bundled or BUNDLED_INCLUDE
    root = root or os.path.dirname(os.path.dirname(HERE))
    for dirs in ([bundled], [os.path.join(root, "include"), os.path.join(root, "src")]):
        if all(any(os.path.isfile(os.path.join(d, h)) for d in dirs) for h in HEADERS):
            return dirs
    raise NativeBuildError("the library's headers (%s) are neither bundled in %s nor in a "
                           "checkout at %s; install the package from a Reservoir checkout "
                           "(pip install ./python)" % (", ".join(HEADERS), bundled, root))


def _headers(dirs):
    """Paths of HEADERS in dirs."""
    return [next(os.path.join(d, h) for d in dirs if os.path.isfile(os.path.join(d, h)))
            for h in HEADERS]


def _command(torch, compiler, output, standard):
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    include = os.path.join(torch_dir, "include")
    lib_dir = os.path.join(torch_dir, "lib")
    reservoir_lib = os.path.realpath(_lib.path())
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    command = [compiler, "-std=" + standard, "-O2", "-fPIC", "-shared", "-w",
               "-D_GLIBCXX_USE_CXX11_ABI=%d" % abi, "-isystem", include,
               "-isystem", os.path.join(include, "torch", "csrc", "api", "include")]
    for folder in _cuda_include_dirs(torch):
        command += ["-isystem", folder]
    for folder in include_dirs():
        command += ["-I", folder]
    command += [SOURCE, "-o", output, "-L" + lib_dir, "-Wl,-rpath," + lib_dir,
                "-lc10", "-lc10_cuda", "-ltorch_cpu", "-ltorch_cuda", reservoir_lib,
                "-Wl,-rpath," + os.path.dirname(reservoir_lib)]
    return command


def _key(torch):
    digest = hashlib.sha256()
    for path in [SOURCE] + LOCAL_HEADERS + _headers(include_dirs()):
        with open(path, "rb") as f:
            digest.update(f.read())
    for part in (torch.__version__, os.path.dirname(os.path.abspath(torch.__file__)),
                 os.path.realpath(_lib.path()), sys.version):
        digest.update(part.encode("utf-8", "replace"))
    return digest.hexdigest()[:20]


def build(torch=None, verbose=False):
    """The path of the native library for this PyTorch, compiling it if not cached.
    Raises NativeBuildError with the compiler's last lines when it fails."""
    if torch is None:
        import torch
    target_dir = cache_dir()
    output = os.path.join(target_dir, "libreservoir_torch_native-%s.so" % _key(torch))
    if os.path.exists(output):
        return output
    os.makedirs(target_dir, exist_ok=True)
    # One process compiles, the others of a launch (torchrun's ranks) wait for it.
    with open(os.path.join(target_dir, "build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(output):
            return output
        return _compile(torch, target_dir, output, verbose)


def _compile(torch, target_dir, output, verbose):
    compiler = _compiler()
    # Built beside the target and renamed into place: processes starting together
    # never load a half-written library.
    handle, partial = tempfile.mkstemp(dir=target_dir, suffix=".so.partial")
    os.close(handle)
    try:
        failures = []
        for standard in ("c++20", "c++17"):
            command = _command(torch, compiler, partial, standard)
            if verbose:
                sys.stderr.write("reservoir: %s\n" % " ".join(command))
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode == 0:
                os.replace(partial, output)
                return output
            failures.append("-std=%s: %s" % (standard, "\n".join(
                (result.stdout + result.stderr).strip().splitlines()[-12:])))
        raise NativeBuildError("compiling %s failed:\n%s" % (SOURCE, "\n".join(failures)))
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def install(torch):
    """Makes PyTorch's current allocator (the pluggable one install() just made and
    wired, not yet initialized) Reservoir's native subclass. Returns (True, None), or
    (False, reason) leaving the pluggable allocator in place."""
    if not enabled():
        _state["reason"] = "RESERVOIR_TORCH_NATIVE=0"
        return False, _state["reason"]
    try:
        path = build(torch)
        library = ctypes.CDLL(path)
    except (NativeBuildError, OSError) as error:
        _state["reason"] = str(error)
        return False, _state["reason"]
    function = library.reservoir_torch_native_install
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    message = ctypes.create_string_buffer(1024)
    if function(message, len(message)) != 0:
        _state["reason"] = message.value.decode("utf-8", "replace")
        return False, _state["reason"]
    active = library.reservoir_torch_native_active
    active.restype = ctypes.c_int
    _state.update(library=library, active=bool(active()), reason=None)
    return _state["active"], None


def status():
    """{"active": whether PyTorch's allocator is the native subclass, "reason": why
    not (None when active or not tried)}."""
    return {"active": _state["active"], "reason": _state["reason"]}


def main(argv):
    import torch

    try:
        path = build(torch, verbose="-v" in argv)
    except NativeBuildError as error:
        sys.stderr.write("reservoir: %s\n" % error)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
