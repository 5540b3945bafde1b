#!/usr/bin/env python3
"""uffd-refs: a process holding a userfaultfd with exactly the features a
lazy restore opens one with (fork, remap, unmap and remove events: 0x4e),
which patch 8 leaves out of a dump, and one more reference to it.

Usage: uffd-refs.py MODE   (run as root; prints its pid, then sleeps)

MODE is what else refers to the userfaultfd:
  plain  nothing (the dump leaves it out; the restore succeeds)
  epev   nothing, beside an epoll listing an eventfd (and a pipe)
  epoll  an epoll lists it as a target
  dup    a second descriptor in the same process
  dupep  a second descriptor, and an epoll lists that one
  moved  an epoll lists it, then it moves to another number (dup2, close)
  two    a second userfaultfd with the same features
  scm    it is in flight on a unix socket (sent, never received)
  scmep  an epoll listing it is in flight on a unix socket (and closed)
  fork   a child forked after it was made holds the inherited copy
  forkep an epoll lists it, then a child is forked (both hold both)
  feat0  nothing, but the userfaultfd has no features at all

uffd-refs.sh dumps (`criu dump -t PID`) and restores (`criu restore -d`)
each mode and says what happened.
"""
import ctypes
import os
import select
import socket
import struct
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
SYS_userfaultfd = 323  # x86_64
UFFDIO_API = 0xC018AA3F  # _IOWR(0xAA, 0x3F, struct uffdio_api)
UFFD_API = 0xAA
LAZY_FEATURES = 0x4E


def uffd(features):
    fd = libc.syscall(SYS_userfaultfd, os.O_CLOEXEC | os.O_NONBLOCK)
    if fd < 0:
        sys.exit("userfaultfd: %s" % os.strerror(ctypes.get_errno()))
    api = ctypes.create_string_buffer(struct.pack("QQQ", UFFD_API, features, 0))
    if libc.ioctl(fd, UFFDIO_API, api) < 0:
        sys.exit("UFFDIO_API: %s" % os.strerror(ctypes.get_errno()))
    return fd


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "plain"
    fd = uffd(0 if mode == "feat0" else LAZY_FEATURES)
    keep = []
    if mode in ("epoll", "forkep"):
        ep = select.epoll()
        ep.register(fd, select.EPOLLIN)
        keep.append(ep)
        if mode == "forkep" and os.fork() == 0:
            while True:
                time.sleep(1)
    elif mode == "moved":
        ep = select.epoll()
        ep.register(fd, select.EPOLLIN)
        keep.append(ep)
        os.dup2(fd, 9)
        os.close(fd)
    elif mode == "epev":
        ep = select.epoll()
        efd = os.eventfd(0)
        r, w = os.pipe()
        ep.register(efd, select.EPOLLIN)
        ep.register(r, select.EPOLLIN)
        keep += [ep, efd, r, w]
    elif mode == "two":
        uffd(LAZY_FEATURES)
    elif mode in ("dup", "dupep"):
        fd2 = os.dup(fd)
        if mode == "dupep":
            ep = select.epoll()
            ep.register(fd2, select.EPOLLIN)
            keep.append(ep)
    elif mode == "scm":
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        socket.send_fds(a, [b"x"], [fd])
        keep += [a, b]
    elif mode == "scmep":
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ep = select.epoll()
        ep.register(fd, select.EPOLLIN)
        socket.send_fds(a, [b"x"], [ep.fileno()])
        ep.close()
        keep += [a, b]
    elif mode == "fork":
        if os.fork() == 0:
            while True:
                time.sleep(1)
    elif mode not in ("plain", "feat0"):
        sys.exit("unknown mode %s" % mode)
    print(os.getpid(), flush=True)
    while True:
        time.sleep(1)


main()
