#!/usr/bin/env python3
"""Run `less +F FILE` on a pseudo-terminal, as a user in a terminal would, and print what it
shows (escape sequences removed) once it has shown MARKER, or after TIMEOUT seconds.

usage: pty-less.py FILE MARKER TIMEOUT
Waits for the line "ready" on stdin before returning... no: prints "following" once less has
drawn its first screen, so the caller can start appending.
"""
import fcntl, os, pty, re, select, struct, sys, termios, time

path, marker, timeout = sys.argv[1], sys.argv[2].encode(), float(sys.argv[3])
pid, fd = pty.fork()
if pid == 0:
    os.environ.update(TERM="xterm", LESS="", LESSHISTFILE="-", LINES="50", COLUMNS="4000")
    os.execvp("less", ["less", "+F", path])
# A wide screen, so no line is folded.
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 4000, 0, 0))
shown = b""
announced = False
deadline = time.time() + timeout
while time.time() < deadline:
    ready, _, _ = select.select([fd], [], [], 0.1)
    if ready:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    if not announced and b"Waiting for data" in shown:
        print("following", flush=True)
        announced = True
    if announced and marker in shown:
        time.sleep(0.2)  # let less finish the screen it is drawing
        try:
            while select.select([fd], [], [], 0.1)[0]:
                shown += os.read(fd, 65536)
        except OSError:
            pass
        break
os.kill(pid, 9)
text = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|\x1b[=>78M]|\r|\x08", b"", shown)
sys.stdout.write(text.decode(errors="replace"))
