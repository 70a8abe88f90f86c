"""One writer per folder: a POSIX lock (`fcntl.lockf`) on `<folder>/.sentemb.lock`, held while a command writes there.

`lockf` locks are what NFS locks across machines (its lock manager), and the kernel (or the NFS
server) releases them when their process dies: a lock file left by a killed process is simply
taken over. The file names its holder (host, PID, command, start time) once the holder has
`claim`ed the folder, so a refused command can say who writes there.

A lock file is unlinked only by the process holding its lock, and a lock counts only when the
locked file is still the one at its path: so a holder that removes its file (`release`) never
lets two processes in. POSIX locks belong to a process, not to a file descriptor: a process must
not open and close its own lock file elsewhere while it holds it (the close would drop the lock).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shlex
import socket
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from sentemb.common.errors import SentembConfigError
from sentemb.common.file_values import parse_json
from sentemb.common.numbers import is_whole, shown_value

LOCK_NAME = ".sentemb.lock"
RETRY_S = 2.0  # how often a waiting command tries again


@dataclass
class FolderLock:
    """A held lock on `path` (`<folder>/.sentemb.lock`); `created`: this process made the file."""

    path: Path
    fd: int | None
    created: bool
    claimed: bool = field(default=False)
    found: bytes = field(default=b"")  # what the file held when this process claimed it (its earlier holder)

    def claim(self, command: str | None = None) -> None:
        """Name this process in the lock file: the folder is now this command's (a refused command names it)."""
        holder = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "command": command or this_command(),
            "started": datetime.now().astimezone().isoformat(timespec="seconds"),
        }
        data = (json.dumps(holder, indent=2) + "\n").encode()
        self.found = os.pread(self.fd, HOLDER_BYTES, 0)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)
        os.fsync(self.fd)  # on NFS: visible to a command refused on another machine
        self.claimed = True

    def release(self, remove: bool = False, restore: bool = False) -> None:
        """Let go; the lock file goes too when asked, or when this process made it and never claimed the folder
        (a refused or skipped command leaves the folder as it found it); `restore`: a file this process claimed but
        did not make gets back what it held (another run's folder, borrowed)."""
        if self.fd is None:
            return
        try:
            if remove or (self.created and not self.claimed):
                self.path.unlink(missing_ok=True)  # while still locked: see the module's docstring
            elif restore and self.claimed and not self.created:
                os.ftruncate(self.fd, 0)
                os.pwrite(self.fd, self.found, 0)
        finally:
            HELD.pop(self.fd, None)
            os.close(self.fd)  # drops the lock
            self.fd = None


# the lock files this process holds (descriptor: (device, inode)): opening and closing one again would drop its lock,
# so a folder this process holds is never locked again by it (`holds`)
HELD: dict[int, tuple[int, int]] = {}


def holds(path: Path) -> bool:
    """This process holds the lock file at `path` already."""
    try:
        found = os.lstat(path)
    except OSError:
        return False
    return (found.st_dev, found.st_ino) in HELD.values()


def this_command() -> str:
    """This process's command line as typed: `python -m sentemb.<command> ...` for one of sentemb's commands."""
    script = Path(sys.argv[0])
    if script.suffix == ".py" and script.parent.name == "sentemb":  # what `python -m` leaves in argv[0]
        return shlex.join(["python", "-m", f"sentemb.{script.stem}", *sys.argv[1:]])
    return shlex.join(sys.argv)


def take_folder_lock(folder: Path, named: str, fix: str, wait_s: float = 0.0) -> FolderLock:
    """The lock of `folder` (which must exist), at once (or within `wait_s` seconds) or not at all: a folder another
    live process holds raises SentembConfigError naming that process, the folder as `named` (with the setting that
    chose it) and `fix`."""
    path = folder / LOCK_NAME
    if holds(path):  # this very command writes there already (e.g. an export's out= inside its own hydra.run.dir)
        raise SentembConfigError(
            f"{named} is the folder this command already writes its own files in, which it cannot hand to a second "
            f"writer. Fix: {fix}"
        )
    deadline = time.monotonic() + wait_s
    replaced = 0  # rounds that found the locked file gone from the path: bounded, so a loop cannot spin
    while True:
        fd, created = open_lock_file(path, named)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = read_holder(fd)
            contended = err.errno in (errno.EACCES, errno.EAGAIN)
            if created and not contended:  # no lock service here: the file this process made goes again
                path.unlink(missing_ok=True)
            os.close(fd)  # a contended file stays: its holder is using it
            if contended and time.monotonic() < deadline:
                time.sleep(RETRY_S)
                continue
            if not contended:
                raise SentembConfigError(
                    f"{named}: {path} cannot be locked ({err}). Fix: a folder on a file system with "
                    "POSIX locks (NFS needs its lock service), or another folder"
                ) from err
            raise SentembConfigError(
                f"{named} is in use by {holder}: a folder has one writer, so this command stopped "
                f"without writing anything. Fix: {fix}"
            ) from None
        if is_current(fd, path):
            found = os.fstat(fd)
            HELD[fd] = (found.st_dev, found.st_ino)
            return FolderLock(path, fd, created)
        os.close(fd)  # its holder removed that file after this process opened it: lock the one at the path now
        replaced += 1
        if replaced >= ATTEMPTS:
            raise SentembConfigError(
                f"{named}: its lock file {path} was replaced {ATTEMPTS} times while this command locked it. Fix: "
                "stop whatever keeps replacing it, then run the command again"
            )


@contextmanager
def enclosing_locks(path: Path, named: str, fix: str) -> Iterator[list[FolderLock]]:
    """The locks of the folders above `path` that hold a lock file (a run folder, an export's out=), taken by a command
    about to write at `path` and held for the `with` block: one another live process holds is refused (naming it,
    `named` and `fix`). Released however the block ends; their files stay (they are their folders')."""
    held: list[FolderLock] = []
    try:
        for folder in Path(os.path.abspath(path)).parents:
            if os.path.lexists(folder / LOCK_NAME) and not holds(folder / LOCK_NAME):  # one of its own: held
                held.append(take_folder_lock(folder, f"{named} (inside {folder})", fix))
        yield held
    finally:
        for lock in held:
            lock.release()


# O_NOFOLLOW: a link at the lock's name is refused, never followed (claim() truncates and writes the file it opens);
# O_NONBLOCK: a FIFO there fails or returns at once instead of waiting for a peer (no effect on a regular file)
OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
ATTEMPTS = 100  # create, then open: each round fails only when another process removed the file in between


def open_lock_file(path: Path, named: str) -> tuple[int, bool]:
    """A read-write descriptor of the lock file, and whether this process created it. Anything at `path` but a
    regular file with one link (a symbolic link, dangling or not, a folder, a FIFO, a hard link to another file) is
    refused with what it is and the fix; every other error is refused too, so no round repeats for ever."""
    for _ in range(ATTEMPTS):
        try:
            return os.open(path, OPEN_FLAGS | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:  # an entry is there (a dangling link too): opened below, without following it
            pass
        except OSError as err:
            raise unwritable(path, named, err) from err
        try:
            fd = os.open(path, OPEN_FLAGS)
        except FileNotFoundError:
            continue  # removed by its holder in between: create it
        except OSError as err:
            if err.errno in REFUSED:
                raise not_a_lock_file(path, named, what_is_there(path)) from None
            raise unwritable(path, named, err) from err
        found = os.fstat(fd)
        if stat.S_ISREG(found.st_mode) and found.st_nlink == 1:
            return fd, False
        os.close(fd)
        raise not_a_lock_file(path, named, what_is_there(path))
    raise SentembConfigError(
        f"{named}: its lock file {path} was created and removed {ATTEMPTS} times while this command tried to open "
        "it. Fix: stop whatever keeps removing it, then run the command again"
    )


# what os.open says of an entry that is not a regular file: a link (ELOOP), a folder (EISDIR), a socket (ENXIO)
REFUSED = (errno.ELOOP, errno.EISDIR, errno.ENXIO)


def what_is_there(path: Path) -> str:
    """What stands at `path`, in words."""
    try:
        found = os.lstat(path)
    except OSError:
        return "not a regular file"
    if stat.S_ISLNK(found.st_mode):
        target = os.readlink(path)
        dangling = "" if os.path.exists(path) else ", dangling"
        return f"a symbolic link (to {target}{dangling})"
    if stat.S_ISDIR(found.st_mode):
        return "a folder"
    if stat.S_ISREG(found.st_mode):
        return f"a file with {found.st_nlink} hard links (the same file under other names)"
    return "not a regular file (a FIFO, socket or device)"


def not_a_lock_file(path: Path, named: str, what: str) -> SentembConfigError:
    return SentembConfigError(
        f"{named}: its lock file {path} is {what}, which sentemb never makes there: it is refused, not followed or "
        f"written into, and nothing was written. Fix: remove it (rm {'-r ' if what == 'a folder' else ''}"
        f"{shlex.quote(str(path))}); sentemb makes the lock file itself"
    )


def unwritable(path: Path, named: str, err: OSError) -> SentembConfigError:
    return SentembConfigError(
        f"{named}: its lock file {path} cannot be opened for writing ({err.strerror}). "
        "Fix: a folder this user can write to"
    )


def is_current(fd: int, path: Path) -> bool:
    """The locked file is the one at `path` (not one its holder unlinked meanwhile, nor a link put in its place)."""
    try:
        here, there = os.fstat(fd), os.lstat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


# what `claim` writes is a few hundred bytes (its command line at most a few KiB): more is not a holder's file
HOLDER_BYTES = 65536


def read_holder(fd: int) -> str:
    """Who holds the lock, in words, from what it wrote in the lock file: an unknown holder when the file is not what
    `claim` writes (unreadable, too long, too deep or not JSON), never an error of its own."""
    try:
        holder = parse_json(os.pread(fd, HOLDER_BYTES, 0).decode() or "null", "the lock file")
    except (OSError, ValueError, SentembConfigError):  # ValueError: not UTF-8 too
        holder = None
    if not isinstance(holder, dict) or not is_whole(holder.get("pid")):
        return "another process (it has not named itself in the lock file yet)"
    pid, host, started = (shown_value(holder.get(key, "?")) for key in ("pid", "host", "started"))
    command = shown_value(holder.get("command", "?"), limit=4096)
    return f"PID {pid} on {host} (since {started}: {command})"
