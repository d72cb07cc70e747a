#!/usr/bin/env python3
"""Fails when a user of libreservoir.so's C ABI disagrees with the headers declaring it.

The C API is declared once, in include/reservoir/reservoir.h (the PyTorch hooks
that reservoir.torch's native part calls, in src/integrations/torch_hooks.hpp).
Checked against them:
  - python/reservoir/_lib.py's _SIGNATURES (ctypes): every function is declared in
    reservoir.h, with as many arguments, each ctypes type the C type's (pointer or
    integer, width and signedness, floating point, a struct by value field by
    field; an enum such as reservoir_status is c_int; c_void_p may stand for a
    pointer to an opaque struct), and the restype likewise (None for void).
  - _lib.py's RESERVOIR_* constants are reservoir.h's enumerators, _STATUS_NAMES
    names every reservoir_status, and _ERRORS has a class for every error status.
  - python/reservoir/_native/torch_native_allocator.cpp includes both headers,
    declares nothing of theirs itself, and calls their functions with as many
    arguments as they take.
Python 3's standard library only; _lib.py is loaded without libreservoir.so.

    scripts/check-c-abi.py [--root DIR]   # exit 1 and a line per mismatch
    scripts/check-c-abi.py --self-test    # proves the check catches mismatches
"""
import ctypes
import importlib.util
import os
import re
import sys
import tempfile

import check_cli

HEADER = "include/reservoir/reservoir.h"
HOOKS = "src/integrations/torch_hooks.hpp"
LIB = "python/reservoir/_lib.py"
NATIVE = "python/reservoir/_native/torch_native_allocator.cpp"
NATIVE_INCLUDES = ("reservoir/reservoir.h", "integrations/torch_hooks.hpp")

# C's scalar types as ("int", bytes, signed) or ("float", bytes), sized as this
# platform's ctypes sizes them (the ABI the library was built for).
_INT = lambda t, signed: ("int", ctypes.sizeof(t), signed)  # noqa: E731
C_SCALARS = {
    "char": ("char",), "signed char": _INT(ctypes.c_byte, True),
    "unsigned char": _INT(ctypes.c_ubyte, False), "_Bool": ("bool",), "bool": ("bool",),
    "short": _INT(ctypes.c_short, True), "unsigned short": _INT(ctypes.c_ushort, False),
    "int": _INT(ctypes.c_int, True), "signed": _INT(ctypes.c_int, True),
    "unsigned": _INT(ctypes.c_uint, False), "unsigned int": _INT(ctypes.c_uint, False),
    "long": _INT(ctypes.c_long, True), "unsigned long": _INT(ctypes.c_ulong, False),
    "long long": _INT(ctypes.c_longlong, True),
    "unsigned long long": _INT(ctypes.c_ulonglong, False),
    "int8_t": ("int", 1, True), "uint8_t": ("int", 1, False),
    "int16_t": ("int", 2, True), "uint16_t": ("int", 2, False),
    "int32_t": ("int", 4, True), "uint32_t": ("int", 4, False),
    "int64_t": ("int", 8, True), "uint64_t": ("int", 8, False),
    "size_t": _INT(ctypes.c_size_t, False), "ptrdiff_t": _INT(ctypes.c_ssize_t, True),
    "intptr_t": ("int", ctypes.sizeof(ctypes.c_void_p), True),
    "uintptr_t": ("int", ctypes.sizeof(ctypes.c_void_p), False),
    "float": ("float", 4), "double": ("float", 8), "void": ("void",),
}
C_KEYWORDS = {"char", "short", "int", "long", "signed", "unsigned", "float", "double", "void",
              "_Bool", "bool"}
QUALIFIERS = {"const", "volatile", "struct", "enum", "restrict"}
CTYPES_INTEGERS = "bBhHiIlLqQ"  # ctypes' integer codes: lower case signed


LEXEMES = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|/\*.*?\*/|//[^\n]*', re.S)


def clean(text, strings=True):
    """text without comments (their newlines kept), and with every string and
    character literal emptied when strings is true."""
    def blank(m):
        lexeme = m.group(0)
        if lexeme.startswith("/"):
            return "\n" * lexeme.count("\n") or " "
        return lexeme[0] * 2 if strings else lexeme
    return LEXEMES.sub(blank, text)


class Header:
    """The declarations of one header: functions (name -> (return type text,
    [parameter texts])), enums (name -> {enumerator: value}), structs with a body
    (name -> [(field, type text)]) and opaque structs."""

    DECL = re.compile(r"RESERVOIR_C_API\s+([^;{}()]+?)\s*\b(\w+)\s*\(([^()]*)\)"
                      r"\s*(?:noexcept\s*)?;")

    def __init__(self, text):
        code = re.sub(r"^\s*#[^\n]*", "", clean(text), flags=re.M)
        self.functions, self.enums, self.structs, self.opaque = {}, {}, {}, set()
        self.callbacks = {}  # function pointer typedefs: name -> (return text, [params])
        for m in re.finditer(r"typedef\s+([^;{}()]+?)\s*\(\s*\*\s*(\w+)\s*\)\s*\(([^()]*)\)\s*;",
                             code):
            params = m.group(3).strip()
            plist = [] if params in ("", "void") else [p.strip() for p in params.split(",")]
            self.callbacks[m.group(2)] = (" ".join(m.group(1).split()), plist)
        self.duplicates = []
        for m in self.DECL.finditer(code):
            ret, name, params = m.group(1), m.group(2), m.group(3).strip()
            if name in self.functions:
                self.duplicates.append(name)
            plist = [] if params in ("", "void") else [p.strip() for p in params.split(",")]
            self.functions[name] = (" ".join(ret.split()), plist)
        for m in re.finditer(r"typedef\s+enum\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;", code, re.S):
            values, value = {}, -1
            for item in filter(None, (i.strip() for i in m.group(1).split(","))):
                name, _, expr = item.partition("=")
                value = int(expr.strip(), 0) if expr.strip() else value + 1
                values[name.strip()] = value
            self.enums[m.group(2)] = values
        for m in re.finditer(r"typedef\s+struct\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;", code, re.S):
            fields = []
            for decl in filter(None, (d.strip() for d in m.group(1).split(";"))):
                words = decl.split()
                fields.append((words[-1], " ".join(words[:-1])))
            self.structs[m.group(2)] = fields
        for m in re.finditer(r"typedef\s+struct\s+(\w+)\s+(\w+)\s*;", code):
            self.opaque.update((m.group(1), m.group(2)))
        for m in re.finditer(r"^\s*struct\s+(\w+)\s*;", code, re.M):
            self.opaque.add(m.group(1))

    def enumerators(self):
        return {k: v for values in self.enums.values() for k, v in values.items()}

    def c_type(self, text):
        """A C type (a parameter's name dropped) as a node: ("ptr", node), a scalar
        of C_SCALARS, ("struct", name, [(field, node)]) or ("opaque", name)."""
        tokens = re.findall(r"\w+|\*", text)
        words = [t for t in tokens if t != "*"]
        if (len(words) > 1 and words[-1] not in C_KEYWORDS | QUALIFIERS
                and any(w not in QUALIFIERS for w in words[:-1])):
            last = len(tokens) - 1 - tokens[::-1].index(words[-1])
            tokens = tokens[:last] + tokens[last + 1:]  # the parameter's name
        base = " ".join(t for t in tokens if t not in QUALIFIERS and t != "*")
        base = re.sub(r"\b(short|long) int$", r"\1", base)
        if base in C_SCALARS:
            node = C_SCALARS[base]
        elif base in self.enums:
            # Passed and returned as an int by the ABIs the library builds for (its
            # enumerators fit one); ctypes has no enum type.
            node = _INT(ctypes.c_int, True)
        elif base in self.structs:
            node = ("struct", base, [(f, self.c_type(t)) for f, t in self.structs[base]])
        elif base in self.opaque:
            node = ("opaque", base)
        elif base in self.callbacks:
            ret, params = self.callbacks[base]
            node = ("fn", self.c_type(ret), tuple(self.c_type(q) for q in params))
        else:
            raise ValueError("unknown C type %r in %r" % (base, text))
        for _ in range(tokens.count("*")):
            node = ("ptr", node)
        return node


def ctypes_node(t):
    """A ctypes type as a node comparable with Header.c_type's."""
    if t is None:
        return ("void",)
    if isinstance(t, type) and issubclass(t, ctypes._CFuncPtr):  # CFUNCTYPE(...)
        return ("fn", ctypes_node(t._restype_), tuple(ctypes_node(a) for a in t._argtypes_))
    if isinstance(t, type) and issubclass(t, ctypes.Structure):
        return ("struct", t.__name__, [(f[0], ctypes_node(f[1])) for f in t._fields_])
    if isinstance(t, type) and issubclass(t, ctypes._Pointer):
        return ("ptr", ctypes_node(t._type_))
    code = getattr(t, "_type_", None)
    if code == "P":
        return ("ptr", ("void",))
    if code == "z":
        return ("ptr", ("char",))
    if code == "c":
        return ("char",)
    if code == "?":
        return ("bool",)
    if code in ("f", "d"):
        return ("float", ctypes.sizeof(t))
    if isinstance(code, str) and len(code) == 1 and code in CTYPES_INTEGERS:
        return ("int", ctypes.sizeof(t), code.islower())
    raise ValueError("unsupported ctypes type %r" % (t,))


def describe(node):
    kind = node[0]
    if kind == "int":
        return "%d-bit %s integer" % (node[1] * 8, "signed" if node[2] else "unsigned")
    if kind == "float":
        return "%d-bit float" % (node[1] * 8)
    if kind == "ptr":
        return "pointer to " + describe(node[1])
    if kind in ("struct", "opaque"):
        return "struct " + node[1]
    if kind == "fn":
        return "function (%s) -> %s" % (", ".join(describe(a) for a in node[2]), describe(node[1]))
    return kind


def mismatch(c, py):
    """None when the ctypes node py passes and returns what the C node c does, else why not."""
    if c[0] == "ptr" and py[0] == "ptr":
        if py[1] == ("void",) and c[1][0] in ("void", "opaque"):
            return None  # c_void_p: void*, or a pointer to a struct Python never sees into
        why = mismatch(c[1], py[1])
        return None if why is None else "pointed-to type: " + why
    if c[0] == "struct" and py[0] == "struct":
        if [f for f, _ in c[2]] != [f for f, _ in py[2]]:
            return "struct %s has fields %s, %s has %s" % (
                c[1], [f for f, _ in c[2]], py[1], [f for f, _ in py[2]])
        for (field, cf), (_, pf) in zip(c[2], py[2]):
            why = mismatch(cf, pf)
            if why is not None:
                return "struct %s field %s: %s" % (c[1], field, why)
        return None
    if c[0] == "fn" and py[0] == "fn" and len(c[2]) == len(py[2]):
        # A callback: its result and arguments each as above (structs by their fields).
        for what, cn, pn in [("result", c[1], py[1])] + [
                ("argument %d" % (i + 1), ca, pa) for i, (ca, pa) in enumerate(zip(c[2], py[2]))]:
            if mismatch(cn, pn) is not None:
                return "C has %s, ctypes %s (%s)" % (describe(c), describe(py), what)
        return None
    if c == py:
        return None
    return "C has %s, ctypes %s" % (describe(c), describe(py))


def type_name(t):
    if t is None:
        return "None"
    if isinstance(t, type) and issubclass(t, ctypes._Pointer):
        return "POINTER(%s)" % type_name(t._type_)
    return t.__name__


def signature_problems(header, name, ret, params, restype, argtypes):
    """Mismatches between one function's declaration and its _SIGNATURES entry."""
    if len(argtypes) != len(params):
        return ["%s: %s takes %d argument(s) in %s (%s), %d in _SIGNATURES" % (
            LIB, name, len(params), HEADER, ", ".join(params) or "void", len(argtypes))]
    problems = []
    why = mismatch(header.c_type(ret), ctypes_node(restype))
    if why:
        problems.append("%s: %s returns %s, restype %s: %s" % (
            LIB, name, ret, type_name(restype), why))
    for i, (param, argtype) in enumerate(zip(params, argtypes)):
        why = mismatch(header.c_type(param), ctypes_node(argtype))
        if why:
            problems.append("%s: %s argument %d is %s, argtype %s: %s" % (
                LIB, name, i + 1, param, type_name(argtype), why))
    return problems


def check_signatures(header, lib):
    """Mismatches between _lib's _SIGNATURES and constants and the header."""
    problems = ["%s: %s is declared twice" % (HEADER, n) for n in header.duplicates]
    for name, (restype, argtypes) in sorted(lib._SIGNATURES.items()):
        if name not in header.functions:
            problems.append("%s: _SIGNATURES has %s, which %s does not declare" % (
                LIB, name, HEADER))
            continue
        ret, params = header.functions[name]
        try:
            problems += signature_problems(header, name, ret, params, restype, argtypes)
        except ValueError as error:  # a type this script does not know yet
            problems.append("%s: %s: %s (teach scripts/check-c-abi.py)" % (LIB, name, error))
    enumerators = header.enumerators()
    for name in sorted(n for n in vars(lib) if re.match(r"RESERVOIR_[A-Z0-9_]+$", n)):
        value = getattr(lib, name)
        if name not in enumerators:
            problems.append("%s: %s is no enumerator of %s" % (LIB, name, HEADER))
        elif value != enumerators[name]:
            problems.append("%s: %s = %r, %s says %d" % (
                LIB, name, value, HEADER, enumerators[name]))
    statuses = header.enums.get("reservoir_status", {})
    for code, short in sorted(getattr(lib, "_STATUS_NAMES", {}).items()):
        name = "RESERVOIR_OK" if short == "ok" else "RESERVOIR_ERROR_" + short.upper()
        if statuses.get(name) != code:
            problems.append("%s: _STATUS_NAMES gives %d the name %r, but %s is %s in %s" % (
                LIB, code, short, name, statuses.get(name, "not declared"), HEADER))
    for name, code in sorted(statuses.items(), key=lambda item: item[1]):
        if code not in getattr(lib, "_STATUS_NAMES", {}):
            problems.append("%s: _STATUS_NAMES has no name for %s (%d)" % (LIB, name, code))
        if code != 0 and code not in getattr(lib, "_ERRORS", {}):
            problems.append("%s: _ERRORS has no exception class for %s (%d)" % (LIB, name, code))
    return problems


def call_arguments(code, start):
    """The number of arguments of the call whose "(" is at start."""
    depth, count, empty = 0, 0, True
    for i in range(start, len(code)):
        ch = code[i]
        if ch in "([{":
            depth += 1
            if depth == 1:
                continue
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return 0 if empty else count + 1
        elif ch == "," and depth == 1:
            count += 1
        if depth >= 1 and not ch.isspace():
            empty = False
    return -1


def check_native(text, declared):
    """Mismatches between the native part's source and the headers' functions
    (declared: name -> number of parameters)."""
    problems = []
    code = clean(text)
    included = re.findall(r'^\s*#\s*include\s*"([^"]+)"', clean(text, strings=False), re.M)
    for header in NATIVE_INCLUDES:
        if header not in included:
            problems.append('%s: does not #include "%s"' % (NATIVE, header))
    for m in re.finditer(r"\b(?:struct|typedef\s+struct)\s+(reservoir_\w+)", code):
        problems.append("%s: declares struct %s itself (include the header)" % (NATIVE, m.group(1)))
    own = set()
    # Declarations and definitions: a type, then the name, then the parameters and ";" or "{".
    signature = re.compile(r"(?:^|[;{}])\s*(?:extern\s+\"\"\s*)?(?:__attribute__\(\(.*?\)\)\s*)?"
                           r"(?:const\s+)?[A-Za-z_][\w:]*[\s*&]+(reservoir_\w+)\s*\(", re.M)
    for m in signature.finditer(code):
        name = m.group(1)
        if re.match(r"[;{}]?\s*(?:return|throw|else|case|new|delete)\b", m.group(0)):
            continue
        close = code.find(")", m.end())
        after = code[close + 1:close + 40].lstrip()
        if after.startswith("noexcept"):
            after = after[len("noexcept"):].lstrip()
        if after.startswith(";"):
            problems.append("%s: declares %s itself (%s)" % (
                NATIVE, name,
                "include the header" if name in declared else "declare it in a header"))
            own.add(name)
        elif after.startswith("{"):
            if name in declared:
                problems.append("%s: defines %s, which a header declares for the library" % (
                    NATIVE, name))
            own.add(name)
    for m in re.finditer(r"\b(reservoir_\w+)\s*\(", code):
        name = m.group(1)
        if name in own:
            continue
        if name not in declared:
            problems.append("%s: calls %s, which neither %s nor %s declares" % (
                NATIVE, name, HEADER, HOOKS))
            continue
        count = call_arguments(code, m.end() - 1)
        if count != declared[name]:
            line = code.count("\n", 0, m.start()) + 1
            problems.append("%s:%d: calls %s with %d argument(s); it takes %d" % (
                NATIVE, line, name, count, declared[name]))
    return problems


def load_lib(path):
    spec = importlib.util.spec_from_file_location("reservoir_lib_checked", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as fh:
        return fh.read()


def check(root, lib=None):
    header = Header(read(root, HEADER))
    hooks = Header(read(root, HOOKS))
    problems = check_signatures(header, lib or load_lib(os.path.join(root, LIB)))
    functions = list(header.functions.items()) + list(hooks.functions.items())
    declared = {name: len(params) for name, (_, params) in functions}
    return problems + check_native(read(root, NATIVE), declared)


SELF_TEST_HEADER = """
typedef enum reservoir_status { RESERVOIR_OK = 0, RESERVOIR_ERROR_IO = 7 } reservoir_status;
typedef enum reservoir_mode { RESERVOIR_MODE_A = 1, RESERVOIR_MODE_B } reservoir_mode;
typedef struct reservoir_pool_id { uint64_t first; uint64_t second; } reservoir_pool_id;
typedef struct reservoir_handle reservoir_handle;
/* a comment: RESERVOIR_C_API int reservoir_commented(void); */
RESERVOIR_C_API const char* reservoir_status_name(reservoir_status status);
RESERVOIR_C_API reservoir_status reservoir_allocate(void** ptr, int64_t size, int device,
                                                    uintptr_t stream);
RESERVOIR_C_API reservoir_status reservoir_text(int device, unsigned options, char* buffer,
                                                size_t capacity, size_t* needed);
RESERVOIR_C_API reservoir_status reservoir_pool(int device, reservoir_pool_id id,
                                                void* const* ptrs, reservoir_handle** out);
RESERVOIR_C_API void reservoir_handle_free(reservoir_handle* handle);
RESERVOIR_C_API double reservoir_fraction(void);
typedef void (*reservoir_watch_fn)(void* ctx, const reservoir_pool_id* id);
RESERVOIR_C_API reservoir_status reservoir_watch(reservoir_watch_fn fn, void* ctx);
"""
SELF_TEST_HOOKS = """
struct CUstream_st;
extern "C" {
RESERVOIR_C_API void* reservoir_torch_malloc(size_t size, int device, CUstream_st* stream);
RESERVOIR_C_API void reservoir_torch_free(void* ptr, size_t size, int device,
                                          CUstream_st* stream) noexcept;
}
"""
SELF_TEST_LIB = """
import ctypes
RESERVOIR_MODE_B = 2
_STATUS_NAMES = {0: "ok", 7: "io"}
_ERRORS = {7: OSError}
class PoolId(ctypes.Structure):
    _fields_ = [("first", ctypes.c_uint64), ("second", ctypes.c_uint64)]
_SIGNATURES = {
    "reservoir_status_name": (ctypes.c_char_p, [ctypes.c_int]),
    "reservoir_allocate": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64,
                                          ctypes.c_int, ctypes.c_size_t]),
    "reservoir_text": (ctypes.c_int, [ctypes.c_int, ctypes.c_uint, ctypes.c_char_p,
                                      ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "reservoir_pool": (ctypes.c_int, [ctypes.c_int, PoolId, ctypes.POINTER(ctypes.c_void_p),
                                      ctypes.POINTER(ctypes.c_void_p)]),
    "reservoir_handle_free": (None, [ctypes.c_void_p]),
    "reservoir_fraction": (ctypes.c_double, []),
    "reservoir_watch": (ctypes.c_int, [ctypes.CFUNCTYPE(None, ctypes.c_void_p,
                                                        ctypes.POINTER(PoolId)), ctypes.c_void_p]),
}
"""
SELF_TEST_NATIVE = """
#include <vector>
#include "integrations/torch_hooks.hpp"
#include "reservoir/reservoir.h"
namespace {
void check(reservoir_status status) { if (status != RESERVOIR_OK) throw 1; }
void* grab(std::size_t size) { return reservoir_torch_malloc(size, 0, nullptr); }
// reservoir_torch_free(a, b) in a comment is not a call
void drop(void* p) {
  reservoir_torch_free(p, 0, 0, nullptr);
  check(reservoir_pool(0, reservoir_pool_id{1, 2}, static_cast<void* const*>(nullptr), nullptr));
}
}  // namespace
extern "C" __attribute__((visibility("default"))) int reservoir_native_own(char* m,
                                                                          std::size_t n) noexcept {
  return reservoir_fraction() > 0 ? reservoir_native_own(m, n) : 0;
}
"""


def self_test():
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            check_cli.write(root, rel, text)
        write(HEADER, SELF_TEST_HEADER)
        write(HOOKS, SELF_TEST_HOOKS)
        write(LIB, SELF_TEST_LIB)
        write(NATIVE, SELF_TEST_NATIVE)
        assert check(root) == [], check(root)
        good = load_lib(os.path.join(root, LIB))  # untouched by the cases below

        def with_lib(**changes):
            lib = load_lib(os.path.join(root, LIB))
            for name, value in changes.items():
                if name == "signatures":
                    lib._SIGNATURES.update(value)
                else:
                    setattr(lib, name, value)
            return check(root, lib)

        c = ctypes
        wrong = {  # one deliberately wrong entry each, and what the check must say
            "width": ({"reservoir_allocate": (c.c_int, [c.POINTER(c.c_void_p), c.c_int,
                                                        c.c_int, c.c_size_t])},
                      "reservoir_allocate argument 2 is int64_t size, argtype c_int: C has "
                      "64-bit signed integer, ctypes 32-bit signed integer"),
            "signedness": ({"reservoir_allocate": (c.c_int, [c.POINTER(c.c_void_p), c.c_uint64,
                                                             c.c_int, c.c_size_t])},
                           "argument 2 is int64_t size, argtype c_ulong: C has 64-bit signed"),
            "unsigned option": ({"reservoir_text": (c.c_int, [c.c_int, c.c_int, c.c_char_p,
                                                              c.c_size_t, c.POINTER(c.c_size_t)])},
                                "reservoir_text argument 2 is unsigned options"),
            "pointer for integer": ({"reservoir_allocate": (c.c_int, [c.POINTER(c.c_void_p),
                                                                      c.c_int64, c.c_int,
                                                                      c.c_void_p])},
                                    "argument 4 is uintptr_t stream, argtype c_void_p: C has "
                                    "64-bit unsigned integer, ctypes pointer to void"),
            "count": ({"reservoir_fraction": (c.c_double, [c.c_int])},
                      "reservoir_fraction takes 0 argument(s)"),
            "restype": ({"reservoir_handle_free": (c.c_int, [c.c_void_p])},
                        "reservoir_handle_free returns void, restype c_int"),
            "status restype": ({"reservoir_fraction": (c.c_float, [])},
                               "reservoir_fraction returns double, restype c_float"),
            "unknown": ({"reservoir_gone": (c.c_int, [])}, "_SIGNATURES has reservoir_gone"),
            "pointee": ({"reservoir_text": (c.c_int, [c.c_int, c.c_uint, c.c_char_p, c.c_size_t,
                                                      c.POINTER(c.c_int)])},
                        "argument 5 is size_t* needed, argtype POINTER(c_int): pointed-to type: "
                        "C has 64-bit unsigned"),
            "void* for a known struct": ({"reservoir_pool": (c.c_int, [c.c_int, c.c_void_p,
                                                                       c.POINTER(c.c_void_p),
                                                                       c.POINTER(c.c_void_p)])},
                                         "argument 2 is reservoir_pool_id id, argtype c_void_p"),
        }
        for what, (entry, expected) in wrong.items():
            found = with_lib(signatures=entry)
            assert len(found) == 1 and expected in found[0], (what, found)

        class Narrow(c.Structure):
            _fields_ = [("first", c.c_uint32), ("second", c.c_uint64)]
        found = with_lib(signatures={"reservoir_pool": (c.c_int, [c.c_int, Narrow,
                                                                  c.POINTER(c.c_void_p),
                                                                  c.POINTER(c.c_void_p)])})
        assert len(found) == 1 and "struct reservoir_pool_id field first" in found[0], found
        found = with_lib(signatures={"reservoir_watch": (c.c_int, [
            c.CFUNCTYPE(None, c.c_void_p, c.POINTER(Narrow)), c.c_void_p])})
        assert len(found) == 1 and "(argument 2)" in found[0], found
        found = with_lib(RESERVOIR_MODE_B=3)
        assert found == [LIB + ": RESERVOIR_MODE_B = 3, " + HEADER + " says 2"], found
        found = with_lib(RESERVOIR_MODE_C=3)
        assert len(found) == 1 and "RESERVOIR_MODE_C is no enumerator" in found[0], found
        found = with_lib(_STATUS_NAMES={0: "ok", 7: "io", 8: "late"}, _ERRORS={})
        assert len(found) == 2 and "gives 8 the name 'late'" in found[0], found
        assert "_ERRORS has no exception class for RESERVOIR_ERROR_IO" in found[1], found
        assert good._SIGNATURES and check(root, good) == []

        native = {  # deliberately wrong native sources, and what the check must say
            "redeclared": (SELF_TEST_NATIVE.replace(
                "namespace {", 'extern "C" {\nvoid reservoir_handle_free(reservoir_handle* h);\n}\n'
                "namespace {"), "declares reservoir_handle_free itself (include the header)"),
            "struct": (SELF_TEST_NATIVE.replace(
                "namespace {", "struct reservoir_pool_id { unsigned long first, second; };\n"
                "namespace {"), "declares struct reservoir_pool_id itself"),
            "no include": (SELF_TEST_NATIVE.replace('#include "reservoir/reservoir.h"\n', ""),
                           'does not #include "reservoir/reservoir.h"'),
            "arity": (SELF_TEST_NATIVE.replace("reservoir_torch_free(p, 0, 0, nullptr)",
                                               "reservoir_torch_free(p, 0, nullptr)"),
                      "calls reservoir_torch_free with 3 argument(s); it takes 4"),
            "undeclared": (SELF_TEST_NATIVE.replace("reservoir_fraction()", "reservoir_ratio()"),
                           "calls reservoir_ratio, which neither"),
        }
        for what, (text, expected) in native.items():
            write(NATIVE, text)
            found = check(root)
            assert len(found) == 1 and expected in found[0], (what, found)
        write(NATIVE, SELF_TEST_NATIVE)
        assert check(root) == [], check(root)
        write(HEADER, SELF_TEST_HEADER.replace("double reservoir_fraction",
                                               "widget reservoir_fraction"))
        found = check(root)
        assert len(found) == 1 and "unknown C type 'widget'" in found[0], found

    # The repository's own _SIGNATURES with one entry made wrong (a 32-bit size).
    real_root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    real = load_lib(os.path.join(real_root, LIB))
    before = check(real_root, real)
    restype, argtypes = real._SIGNATURES["reservoir_allocate"]
    real._SIGNATURES["reservoir_allocate"] = (restype, [argtypes[0], ctypes.c_int32] + argtypes[2:])
    found = [p for p in check(real_root, real) if p not in before]
    assert len(found) == 1 and "reservoir_allocate argument 2 is int64_t size" in found[0], found
    print("check-c-abi self-test: ok")
    return 0


def summary(root):
    header = Header(read(root, HEADER))
    lib = load_lib(os.path.join(root, LIB))
    return "check-c-abi: ok (%d of the %d functions of %s in _SIGNATURES; %s)" % (
        len(lib._SIGNATURES), len(header.functions), HEADER, NATIVE)


def main():
    return check_cli.main(
        __doc__, check, self_test,
        lambda n: "check-c-abi: %d mismatch(es) with %s / %s" % (n, HEADER, HOOKS), summary)


if __name__ == "__main__":
    sys.exit(main())
