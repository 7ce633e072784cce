"""The Python package declares the C ABI by hand (ctypes in _lib.py); this
holds those declarations to the checked-in header, ffi/include/ringleader.h
(itself held to the Rust code by ffi/tests/header.rs): every function's
result and argument types, and the fields of ``rl_config``. A signature that
drifts would pass wrong values through ctypes without any error."""

import ctypes
import re
from pathlib import Path

from ringleader import _lib

HEADER = Path(__file__).resolve().parents[2] / "include" / "ringleader.h"

# Header functions the Python package does not call, and why.
NOT_USED = {
    "rl_store_addr": "Store exposes the port; the host is the caller's bind address",
    "rl_dtype_size": "numpy and torch know their element sizes",
}

# C type (as cbindgen writes it) -> the ctypes type that passes it.
SCALARS = {
    "int": ctypes.c_int,
    "int64_t": ctypes.c_int64,
    "uint64_t": ctypes.c_uint64,
    "size_t": ctypes.c_size_t,
    "double": ctypes.c_double,
    "bool": ctypes.c_bool,
    "void": None,
}


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", text)


def _ctype(c: str):
    """The ctypes type that matches C type ``c``."""
    c = " ".join(c.replace("*", " * ").split())
    const = c.startswith("const ")
    c = c.replace("const ", "")
    stars = c.count("*")
    base = c.replace("*", "").strip()
    if stars == 0:
        return SCALARS[base]
    if base == "char" and stars == 1:
        # const char *: a string in, or a static string out (bytes);
        # char *: a string ringleader owns (rl_string_free), kept as a
        # pointer so ctypes does not copy and lose it.
        return ctypes.c_char_p if const else ctypes.c_void_p
    if base.startswith("struct rl_config") and stars == 1:
        return ctypes.POINTER(_lib.Config)
    if base.startswith("struct ") or base == "void":
        return ctypes.c_void_p if stars == 1 else ctypes.POINTER(ctypes.c_void_p)
    if base == "char" and stars == 2:
        return ctypes.POINTER(ctypes.c_void_p)  # an owned string's out-parameter
    if stars == 1 and base in SCALARS:
        return ctypes.POINTER(SCALARS[base])
    raise AssertionError(f"no ctypes mapping for C type {c!r}")


def header_functions():
    """name -> (result C type, [argument C types]) for every function of the header."""
    text = _strip_comments(HEADER.read_text())
    funcs = {}
    for m in re.finditer(r"^([A-Za-z_][\w \*]*?)\b(rl_\w+)\(([^)]*)\);", text, flags=re.M):
        ret, name, args = m.group(1), m.group(2), " ".join(m.group(3).split())
        params = [] if args in ("", "void") else [a.strip() for a in args.split(",")]
        # Drop the parameter names.
        types = [re.sub(r"\b\w+$", "", p).strip() for p in params]
        funcs[name] = (ret.strip(), types)
    return funcs


def header_config_fields():
    text = _strip_comments(HEADER.read_text())
    body = re.search(r"typedef struct rl_config \{(.*?)\} rl_config;", text, flags=re.S).group(1)
    fields = []
    for decl in body.split(";"):
        decl = " ".join(decl.split())
        if decl:
            ctype, name = re.match(r"(.*?)(\w+)$", decl).groups()
            fields.append((name, ctype.strip()))
    return fields


def test_the_header_is_parsed():
    funcs = header_functions()
    assert len(funcs) > 40 and "rl_all_reduce" in funcs and "rl_init" in funcs, sorted(funcs)
    assert funcs["rl_all_reduce"][1][:2] == ["const struct rl_comm *", "void *"], funcs["rl_all_reduce"]


def test_every_header_function_is_declared_alike_in_python():
    funcs = header_functions()
    problems = []
    for name, (ret, args) in sorted(funcs.items()):
        if name not in _lib._SIGNATURES:
            if name not in NOT_USED:
                problems.append(f"{name}: in the header, not declared in _lib.py (or listed in NOT_USED)")
            continue
        py_ret, py_args = _lib._SIGNATURES[name]
        want_ret = _ctype(ret)
        want_args = [_ctype(a) for a in args]
        if py_ret is not want_ret:
            problems.append(f"{name}: result {py_ret} in Python, {ret!r} ({want_ret}) in the header")
        if len(py_args) != len(want_args):
            problems.append(f"{name}: {len(py_args)} arguments in Python, {len(want_args)} in the header")
            continue
        for i, (p, w, c) in enumerate(zip(py_args, want_args, args)):
            if p is not w:
                problems.append(f"{name}: argument {i} is {p} in Python, {c!r} ({w}) in the header")
    for name in _lib._SIGNATURES:
        if name not in funcs:
            problems.append(f"{name}: declared in _lib.py, absent from the header")
    assert not problems, "\n".join(problems)


def test_rl_config_fields_match_the_header():
    want = [(name, _ctype(c)) for name, c in header_config_fields()]
    have = [(name, t) for name, t in _lib.Config._fields_]
    assert [n for n, _ in have] == [n for n, _ in want], (have, want)
    for (name, t), (_, w) in zip(have, want):
        assert t is w, f"rl_config.{name}: {t} in Python, {w} in the header"


def test_a_drifted_signature_is_caught():
    funcs = header_functions()
    ret, args = funcs["rl_broadcast"]
    wrong = [_ctype(a) for a in args]
    wrong[4] = ctypes.c_int  # the root is int64_t
    assert wrong != _lib._SIGNATURES["rl_broadcast"][1]
