"""The program that runs inside a sandbox process: it installs the guard, runs the code, then each unit test.

This file is copied into the sandbox's folder and run there as ``python -I -B boot.py`` (isolated mode: no
environment variables, no user site, not even the folder on ``sys.path``). It uses the standard library only and
imports nothing of this package. It reads, in order:

* the run's token, one line on stdin (then stdin is closed): every result line it writes carries it, so a program
  that writes result lines of its own, or exits early, is not believed;
* ``job.json`` in the folder: ``{"code": str, "test": str, "entry_point": str}``.

It then installs an audit hook (PEP 578; it cannot be removed) that keeps the code to its folder: files open for
writing only inside the folder, for reading only there and in the Python installation; no sockets, no new processes
(fork, exec, spawn, subprocess, os.system), no signals to other processes, no ctypes. The limits of the process
itself (CPU time, memory, file size, process count, a network namespace, another user) are set by its parent before
this file runs.

What this guards is the machine. The score resists the plain ways around the tests (an early ``exit``, a
``SystemExit`` or ``KeyboardInterrupt``, printed or written fake results: they lack the token), but code written
against this harness itself, reading the token out of the interpreter's memory, could forge it: the harness and the
code share one process.

Each unit test is a top-level statement of the test's ``check`` function that contains an ``assert``; the others
are set-up, run in order. One line per unit goes to file descriptor 3: ``<token> <index> pass|fail``, then
``<token> done``.
"""

import ast
import json
import os
import sys

RESULTS_FD = 3
#: Audit events refused outright (by prefix): sockets, new processes, signals, native code, introspection.
REFUSED = (
    "socket.", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.popen",
    "subprocess.", "os.setsid", "os.setpgid", "os.killpg", "ctypes.", "os.putenv", "os.unsetenv", "pty.",
    "resource.setrlimit", "resource.prlimit", "os.chroot",
)  # fmt: skip
#: Modules the code may not import: native calls and process machinery.
REFUSED_IMPORTS = ("ctypes", "_ctypes", "_posixsubprocess", "multiprocessing", "_multiprocessing", "cffi", "pty")
#: Audit events whose first argument is a path the code writes (or removes, renames, links, changes).
WRITES = (
    "os.remove", "os.unlink", "os.rename", "os.replace", "os.rmdir", "os.mkdir", "os.symlink", "os.link",
    "os.chmod", "os.chown", "os.truncate", "os.utime", "os.chflags", "os.lchflags", "os.lchown", "shutil.rmtree",
    "shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.copytree", "shutil.move",
)  # fmt: skip
#: Audit events whose first argument is a path the code reads (lists).
READS = ("os.listdir", "os.scandir", "os.chdir", "glob.glob")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _inside(path, roots):
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


class Guard:
    """The audit hook: ``folder`` is writable and readable, ``readable`` (the Python installation) readable."""

    def __init__(self, folder, readable):
        self.folder, self.readable, self.own = folder, readable, os.getpid()

    def real(self, path):
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        return os.path.realpath(os.path.join(self.folder, os.fspath(path)))

    @staticmethod
    def refuse(what):
        raise PermissionError(f"the sandbox refuses {what}")

    def check_open(self, path, mode, flags):
        if path is None or isinstance(path, int):
            return
        writing = bool(set(mode or "") & set("wax+")) or bool((flags or 0) & _WRITE_FLAGS)
        where = self.real(path)
        if not _inside(where, (self.folder,)) and (writing or not _inside(where, self.readable)):
            self.refuse(f"opening {os.fspath(path)!r} ({'write' if writing else 'read'})")

    def check_paths(self, event, paths, roots):
        for path in paths:
            if isinstance(path, (str, bytes, os.PathLike)) and not _inside(self.real(path), roots):
                self.refuse(f"{event} of {os.fspath(path)!r}")

    def __call__(self, event, args):
        if event.startswith(REFUSED):
            self.refuse(event)
        elif event == "import" and args[0].split(".")[0] in REFUSED_IMPORTS:
            self.refuse(f"import {args[0]}")
        elif event == "os.kill" and args[0] not in (self.own, 0):
            self.refuse(f"os.kill of process {args[0]}")
        elif event == "open":
            self.check_open(*args)
        elif event in WRITES:
            self.check_paths(event, args[:2], (self.folder,))
        elif event in READS:
            self.check_paths(event, args[:1] or (".",), (self.folder, *self.readable))


def units(test_source):
    """The test's ``check`` function: its argument's name and its top-level statements, each marked as a unit test
    (it holds an ``assert``) or set-up; and the test module's other statements."""
    tree = ast.parse(test_source)
    check = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check")
    header = [n for n in tree.body if n is not check]
    argument = check.args.args[0].arg
    body = [(stmt, any(isinstance(n, ast.Assert) for n in ast.walk(stmt))) for stmt in check.body]
    return header, argument, body


def main():
    token = sys.stdin.readline().strip()
    sys.stdin.close()
    folder = os.getcwd()
    with open(os.path.join(folder, "job.json"), encoding="utf-8") as f:
        job = json.load(f)
    header, argument, body = units(job["test"])
    readable = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
    results = os.fdopen(RESULTS_FD, "w", buffering=1)
    sys.addaudithook(Guard(os.path.realpath(folder), readable))

    def report(line):
        results.write(f"{token} {line}\n")

    namespace = {"__name__": "__main__"}
    try:
        exec(compile(job["code"], "solution.py", "exec"), namespace)  # noqa: S102  (the point of a sandbox)
        candidate = namespace[job["entry_point"]]
        scope = {"__name__": "__test__", argument: candidate}
        exec(compile(ast.Module(header, []), "test.py", "exec"), scope)  # noqa: S102
    except BaseException:  # noqa: BLE001  (any failure of the code fails every unit)
        report("done")
        return
    index = 0
    for stmt, is_unit in body:
        try:
            exec(compile(ast.Module([stmt], []), "test.py", "exec"), scope)  # noqa: S102
            ok = True
        except BaseException:  # noqa: BLE001  (a unit that raises, exits or is interrupted fails)
            ok = False
        if is_unit:
            report(f"{index} {'pass' if ok else 'fail'}")
            index += 1
        elif not ok:
            break  # set-up failed: the remaining units fail
    report("done")


if __name__ == "__main__":
    main()
