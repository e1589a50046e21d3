"""What the adapters read of a build, read from its files without loading them: the op schemas
its shared objects register (their TORCH_LIBRARY schema text), the signatures of the Python
functions and methods the adapters call (entry points, metadata and planner functions), and the
sha256 of its kernel objects (from build.json). `kernels diff` compares two builds' surfaces."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from dsv4bench.kernels.store import Build

# the names each library's adapter reads (ops, functions, classes whose methods it calls)
READ = {
    "flashmla": r"sparse_(decode|prefill)_fwd|get_mla_metadata|flash_mla_sparse_fwd",
    "fa3": r"^fwd$|flash_attn_varlen_func|get_scheduler_metadata",
    "deepgemm": r"paged_mqa_logits|mqa_logits|get_num_sms",
    "flashinfer": r"BatchMLAPagedAttentionWrapper|trtllm_batch_decode.*mla|top_k|sparse_mla",
}
ANY = r"."
KERNEL_SUFFIXES = (".so", ".cubin", ".fatbin")
# a schema as TORCH_LIBRARY keeps it: name(Type arg, ...) -> returns
SCHEMA = re.compile(
    rb"([A-Za-z_][A-Za-z0-9_.]*)\(((?:Tensor|int|float|bool|str|Scalar|SymInt|Device|Layout|"
    rb"Generator|MemoryFormat)[\x20-\x7e]*?)\) -> ([\x20-\x7e]+)"
)
NAMESPACE = re.compile(rb"TORCH_LIBRARY(?:_FRAGMENT)?_(?:static_)?init_([A-Za-z0-9_]+?)_?\d*\x00")
ARROW = b") -> "
MAX_SCHEMA = 4096  # bytes of one schema's text
TEXT_BYTES = 4 << 20  # a Python file larger than this is data, not an entry point


@dataclass
class Surface:
    ops: dict[str, str] = field(default_factory=dict)  # op name -> its schema's arguments
    functions: dict[str, str] = field(default_factory=dict)  # module:qualname -> signature
    objects: dict[str, str] = field(default_factory=dict)  # kernel object path -> sha256


def op_schemas(path: Path, wanted: re.Pattern) -> dict[str, str]:
    """name -> `(args) -> returns` of every op schema a shared object carries whose name the
    adapter reads, prefixed with the namespace it registers (one library, one namespace)."""
    data = path.read_bytes()
    spaces = sorted({m.group(1).decode() for m in NAMESPACE.finditer(data)})
    prefix = f"{spaces[0]}::" if len(spaces) == 1 else ""
    found = {}
    for text in _schema_strings(data):
        m = SCHEMA.fullmatch(text)
        if not m:
            continue
        name = m.group(1).decode()
        if wanted.search(name):
            found[prefix + name] = f"({m.group(2).decode()}) -> {m.group(3).decode()}"
    return found


def _schema_strings(data: bytes) -> list[bytes]:
    """The printable strings around every `) -> ` of a binary (a schema's shape), found by a
    literal search: a regex over a 160 MiB object would take minutes."""
    out, at = [], data.find(ARROW)
    while at >= 0:
        start = at
        while start > 0 and 0x20 <= data[start - 1] <= 0x7E and at - start < MAX_SCHEMA:
            start -= 1
        end = data.find(b"\x00", at)
        out.append(data[start : end if end >= 0 else len(data)])
        at = data.find(ARROW, at + len(ARROW))
    return out


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    a = node.args
    names = [x.arg for x in (*a.posonlyargs, *a.args)]
    defaults = [None] * (len(names) - len(a.defaults)) + list(a.defaults)
    parts = [n if d is None else f"{n}=…" for n, d in zip(names, defaults, strict=True)]
    if a.vararg:
        parts.append(f"*{a.vararg.arg}")
    elif a.kwonlyargs:
        parts.append("*")
    kw = zip(a.kwonlyargs, a.kw_defaults, strict=True)
    parts += [k.arg + ("" if d is None else "=…") for k, d in kw]
    if a.kwarg:
        parts.append(f"**{a.kwarg.arg}")
    return f"({', '.join(parts)})"


def python_signatures(path: Path, module: str, wanted: re.Pattern) -> dict[str, str]:
    """module:qualname -> signature of the functions (and every method of the classes) a
    Python file or stub defines whose names the adapter reads."""
    try:
        if path.stat().st_size > TEXT_BYTES:
            return {}
        text = path.read_text(errors="replace")
        if not wanted.search(text):
            return {}
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError):
        return {}
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and wanted.search(node.name):
            found[f"{module}:{node.name}"] = _signature(node)
        elif isinstance(node, ast.ClassDef) and wanted.search(node.name):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found[f"{module}:{node.name}.{item.name}"] = _signature(item)
    return found


def surface(folder: Path, build: Build) -> Surface:
    """A build's surface, from its folder and build.json."""
    wanted = re.compile(READ.get(build.library, ANY))
    s = Surface()
    for f in build.files:
        path = folder / f.path
        if f.path.endswith(KERNEL_SUFFIXES) or ".so." in f.path:
            s.objects[f.path] = f.sha256
            if f.path.endswith(".so") and path.is_file():
                s.ops.update(op_schemas(path, wanted))
        elif f.path.endswith((".py", ".pyi")) and path.is_file():
            module = f.path.removeprefix("site/").rsplit(".", 1)[0].replace("/", ".")
            module = module.removesuffix(".__init__")
            s.functions.update(python_signatures(path, module, wanted))
    return s


def first_difference(old: str, new: str) -> str:
    """The first argument where two `(a, b, ...)` signatures or schemas part."""

    def args(sig: str) -> list[str]:
        inner = sig[sig.index("(") + 1 : sig.rindex(")")] if "(" in sig else sig
        return [a.strip() for a in inner.split(",") if a.strip()]

    a, b = args(old.split(" -> ")[0]), args(new.split(" -> ")[0])
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"argument {i + 1}: {x} -> {y}"
    if len(a) != len(b):
        more, which = (b[len(a)], "added") if len(b) > len(a) else (a[len(b)], "removed")
        return f"argument {min(len(a), len(b)) + 1} {which}: {more}"
    return f"returns: {old.split(' -> ')[-1]} -> {new.split(' -> ')[-1]}"
