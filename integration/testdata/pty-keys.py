#!/usr/bin/env python3
"""Run a program on a pseudo-terminal and type into it, as a user at a terminal would.

usage: pty-keys.py KEYS PROGRAM [ARG...]
KEYS is typed in chunks separated by "|" (Python escapes allowed, e.g. "\\x0f" for Ctrl-O),
each once the program has drawn its answer to the last. Exits with the program's
status (1 if it is still running 10 s after the last chunk).
"""
import os, pty, select, sys, time

keys = sys.argv[1].encode().decode("unicode_escape").split("|")
pid, fd = pty.fork()
if pid == 0:
    os.environ.update(TERM="xterm", LINES="24", COLUMNS="80")
    os.execvp(sys.argv[2], sys.argv[2:])

def drain(seconds):
    """Reads what the program draws until it has been quiet for a while (at most seconds)."""
    end, quiet, drew = time.time() + seconds, time.time(), False
    while time.time() < end and not (drew and time.time() - quiet > 0.3):
        if select.select([fd], [], [], 0.05)[0]:
            try:
                if not os.read(fd, 65536):
                    return
            except OSError:
                return
            quiet, drew = time.time(), True

drain(5)
for chunk in keys:
    os.write(fd, chunk.encode())
    drain(3)
for _ in range(200):
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        sys.exit(os.waitstatus_to_exitcode(status))
    drain(0.05)
os.kill(pid, 9)
sys.exit(1)
