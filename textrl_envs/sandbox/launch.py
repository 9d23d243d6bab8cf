"""The first program of a sandbox process: it sets the process's limits, then becomes ``boot.py``.

Run by the parent as ``python -I -B launch.py CONFIG`` in a new session (its own process group), with the run's
folder as its working directory; ``CONFIG`` is JSON: ``{"cpu": s, "memory": bytes, "file": bytes, "processes": n,
"open_files": n, "network": bool, "uid": int | null, "results_fd": int}``. Standard library only, single-threaded (a
program of its own rather than a ``preexec_fn``, which is unsafe in the parent's threads). In order:

1. resource limits (``setrlimit``): CPU seconds (SIGXCPU, then SIGKILL a second later), address space, size of any
   file written, open files, processes (enforced by the kernel for users other than root), no core files;
2. a new network namespace (``unshare(CLONE_NEWNET)``, with a new user namespace when not root) when asked and the
   OS allows it: the code then sees no network but a loopback that is down;
3. another user (``setgid``/``setuid``, root only), when the parent gives one: files of the trainer's user are then
   out of reach and the process count is that user's alone;
4. ``results_fd`` moved to file descriptor 3, then ``exec`` of ``boot.py``.

It writes ``netns yes`` or ``netns no`` to the results first, so that the parent knows what the code got.
"""

import ctypes
import json
import os
import resource
import sys

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
RESULTS_FD = 3


def limit(kind, value):
    resource.setrlimit(kind, (value, value))


def new_network():
    libc = ctypes.CDLL(None, use_errno=True)
    flags = CLONE_NEWNET if os.getuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET
    return libc.unshare(flags) == 0


def main():
    config = json.loads(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_CPU, (config["cpu"], config["cpu"] + 1))
    limit(resource.RLIMIT_AS, config["memory"])
    limit(resource.RLIMIT_FSIZE, config["file"])
    limit(resource.RLIMIT_NOFILE, config["open_files"])
    limit(resource.RLIMIT_NPROC, config["processes"])
    limit(resource.RLIMIT_CORE, 0)
    network = config["network"] and new_network()
    if config["uid"] is not None:
        os.setgroups([])
        os.setgid(config["uid"])
        os.setuid(config["uid"])
    os.dup2(config["results_fd"], RESULTS_FD)
    if config["results_fd"] != RESULTS_FD:
        os.close(config["results_fd"])
    os.write(RESULTS_FD, f"netns {'yes' if network else 'no'}\n".encode())
    os.execv(sys.executable, [sys.executable, "-I", "-B", "boot.py"])


if __name__ == "__main__":
    main()
