"""How each language's block is checked. A runner returns (status, detail):
status "ok", "failed", or "not run" (the tool is absent by design in this scope)."""

import os
import re
import shutil
import subprocess
import tempfile

OUTPUT_LINE = re.compile(r"^-- ( |-)")  # "--  value" or "-- ----+----": psql's lines after "-- "
MARK = "@@doc-check segment "


def _run(argv, ctx, timeout=120, stdin=None, cwd=None, env=None):
    try:
        p = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout,
                           cwd=cwd or ctx.root, env=env or ctx.env)
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout} s"
    return p.returncode, p.stdout, p.stderr


def sql_segments(lines):
    """Splits a SQL block into (statement lines, expected output lines or None).

    An expected output is a run of lines starting "--  " or "-- -" right after a
    statement: psql's aligned output, each line prefixed with "-- ". With a
    "-- ---" separator line it is the full table (header, separator, rows);
    without one, the rows alone (psql -t)."""
    segments, current, expected = [], [], []
    for line in lines:
        if OUTPUT_LINE.match(line) and current:
            expected.append(line[3:].rstrip())
            continue
        if expected:
            segments.append((current, expected))
            current, expected = [], []
        current.append(line)
    if current or expected:
        segments.append((current, expected or None))
    return segments


def _trim(lines):
    lines = [line.rstrip() for line in lines]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def run_sql(block, ctx):
    segments = sql_segments(block.lines)
    script = ["\\pset footer off"]
    for number, (statements, expected) in enumerate(segments):
        script.append(f"\\echo '{MARK}{number}'")
        if expected is not None:
            full = any(line.startswith("---") for line in expected)
            script.append("\\pset tuples_only " + ("off" if full else "on"))
        script.extend(statements)
    code, out, err = _run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", ctx.database],
                          ctx, stdin="\n".join(script) + "\n")
    if code:
        return "failed", f"psql exited {code}: {err.strip()}"
    outputs, current = {}, None
    for line in out.split("\n"):
        if line.startswith(MARK):
            current = int(line[len(MARK):])
            outputs[current] = []
        elif current is not None:
            outputs[current].append(line)
    compared = 0
    for number, (statements, expected) in enumerate(segments):
        if expected is None:
            continue
        got = _trim(outputs.get(number, []))
        if got != _trim(expected):
            shown = "\n".join("    -- " + g for g in got)
            return "failed", (f"output after line {block.line + _offset(segments, number)} differs;"
                              f" psql printed:\n{shown}")
        compared += 1
    return "ok", f"ran through psql, {compared} output(s) compared"


def _offset(segments, number):
    return sum(len(s) + len(e or []) for s, e in segments[:number]) + len(segments[number][0])


CPP_WRAP_UNLESS = re.compile(r"^\s*int\s+main\s*\(", re.M)


def run_cpp(block, ctx):
    if not ctx.cxxflags:
        return "failed", "no installed client library to compile against (pkg-config idempotency_client)"
    includes = [line for line in block.lines if line.startswith("#include")]
    body = [line for line in block.lines if not line.startswith("#include")]
    if CPP_WRAP_UNLESS.search(block.text):
        source = block.text
    else:
        source = "\n".join(includes + ['#include "prelude.hpp"', "void doc_block() {"] + body + ["}"])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "block.cpp")
        with open(path, "w") as f:
            f.write(source + "\n")
        argv = [ctx.cxx, "-fsyntax-only", "-Wall", "-Werror", "-Wno-unused-variable",
                "-I", os.path.join(ctx.root, "tests/docs"), *ctx.cxxflags, path]
        code, out, err = _run(argv, ctx)
    if code:
        return "failed", f"{' '.join(argv[:2])} failed:\n{err.strip()[:3000]}"
    return "ok", "compiled against the installed client library (not run)"


def run_python(block, ctx):
    if block.marker == "compile-only":
        try:
            compile(block.text, block.where, "exec")
        except SyntaxError as e:
            return "failed", f"syntax error: {e}"
        return "ok", "compiled (compile-only)"
    with open(os.path.join(ctx.root, "tests/docs/prelude.py")) as f:
        prelude = f.read()
    source = prelude + "\n# --- the block\n" + block.text + "\n_doc_check_end()\n"
    env = dict(ctx.env, PYTHONPATH=os.path.join(ctx.root, "client/python/src"))
    code, out, err = _run([ctx.python, "-c", source], ctx, env=env)
    if code:
        return "failed", f"python exited {code}:\n{err.strip()[-3000:]}"
    return "ok", "ran against the cluster"


def _node_dir(ctx):
    """A folder whose node_modules resolve pg-idempotency (client/node, built) and its deps."""
    package = os.path.join(ctx.root, "client/node")
    if not os.path.isfile(os.path.join(package, "dist/index.js")):
        return None, "client/node is not built (npm install; npm run build in client/node)"
    work = tempfile.mkdtemp(prefix="doc-check-node.")
    modules = os.path.join(work, "node_modules")
    os.mkdir(modules)
    os.symlink(package, os.path.join(modules, "pg-idempotency"))
    for name in os.listdir(os.path.join(package, "node_modules")):
        os.symlink(os.path.join(package, "node_modules", name), os.path.join(modules, name))
    return work, ""


def run_node(block, ctx):
    if not shutil.which("node"):
        return ctx.absent("node")
    work, why = _node_dir(ctx)
    if not work:
        return "failed", why
    try:
        with open(os.path.join(ctx.root, "tests/docs/prelude.mjs")) as f:
            prelude = f.read()
        path = os.path.join(work, "block.mjs")
        with open(path, "w") as f:
            f.write(prelude + "\n// --- the block\n" + block.text + "\nawait globalThis.docCheckEnd();\n")
        argv = ["node", "--check", path] if block.marker == "compile-only" else ["node", path]
        code, out, err = _run(argv, ctx, cwd=work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if code:
        return "failed", f"node exited {code}:\n{err.strip()[-3000:]}"
    return "ok", "syntax-checked (compile-only)" if block.marker else "ran against the cluster"


def run_shell(block, ctx):
    code, out, err = _run(["bash", "-n"], ctx, stdin=block.text)
    if code:
        return "failed", f"bash -n: {err.strip()}"
    return "ok", "syntax-checked (bash -n)"


def run_go(block, ctx):
    if not shutil.which("gofmt"):
        return ctx.absent("gofmt")
    source = block.text
    if not re.search(r"^package ", source, re.M):
        source = "package doc\n\nfunc _() {\n" + source + "}\n"
    code, out, err = _run(["gofmt", "-e"], ctx, stdin=source)
    if code:
        return "failed", f"gofmt -e: {err.strip()}"
    return "ok", "syntax-checked (gofmt -e)"


def run_rust(block, ctx):
    if not shutil.which("rustfmt"):
        return ctx.absent("rustfmt")
    source = block.text
    if not re.search(r"^\s*(fn|use|pub|struct|enum|impl|mod|#\[)\b", source, re.M):
        source = "fn _doc() {\n" + source + "}\n"
    code, out, err = _run(["rustfmt", "--edition", "2021", "--emit", "stdout"], ctx, stdin=source)
    if code:
        return "failed", f"rustfmt: {err.strip()}"
    return "ok", "syntax-checked (rustfmt)"


def run_cmake(block, ctx):
    """Configures a project holding the block, against the installed client package;
    the block's target is `my_service` (the docs' name), built from an empty main."""
    if not ctx.prefix:
        return "failed", "no installed client package to configure against (IDEM_DOCS_PREFIX)"
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "main.cpp"), "w") as f:
            f.write("int main() { return 0; }\n")
        with open(os.path.join(tmp, "CMakeLists.txt"), "w") as f:
            f.write("cmake_minimum_required(VERSION 3.25)\nproject(doc_check LANGUAGES CXX)\n"
                    "add_executable(my_service main.cpp)\n" + block.text)
        code, out, err = _run(["cmake", "-S", tmp, "-B", os.path.join(tmp, "build"),
                               f"-DCMAKE_PREFIX_PATH={ctx.prefix}"], ctx)
    if code:
        return "failed", f"cmake configure failed:\n{(out + err).strip()[-3000:]}"
    return "ok", "configured against the installed CMake package"


RUNNERS = {
    "cmake": run_cmake,
    "sql": run_sql,
    "cpp": run_cpp, "c++": run_cpp,
    "python": run_python, "py": run_python,
    "js": run_node, "javascript": run_node, "mjs": run_node, "ts": run_node, "typescript": run_node,
    "sh": run_shell, "bash": run_shell, "shell": run_shell,
    "go": run_go,
    "rust": run_rust,
}
