"""Every file a sentemb command writes is published whole, and never written through a link it did not make.

A file is written into a fresh temporary file in its destination's folder, fsynced, then published:
- `replace=True`: renamed over the destination. A rename replaces whatever stands at the name (a symbolic link, a
  file an editor holds open) and writes into nothing else: a link planted at the destination is replaced by the
  file, its target left as it was;
- `replace=False`: hard-linked to the destination, which refuses (FileExistsError) any entry already there, a
  dangling link included (a file system without hard links: checked, then renamed).
The temporary file is an unnamed one (Linux's O_TMPFILE, on ext4, XFS, btrfs, tmpfs) where the file system has it,
so a process killed at any point (SIGKILL included) leaves nothing; elsewhere (NFS, ...) it is
`.<name>.<host>-<pid>-<token>.partial`, created with O_EXCL | O_NOFOLLOW, removed when the write fails or is
interrupted (`exit_on_sigterm` turns SIGTERM into an exception for that), and, when its process was killed outright,
removed by the next write of the same name on the same host (its process is gone: `remove_stale_partials`).

A folder of several files (an export, a comparison) is built in a hidden staging folder beside its destination
(`staging_folder`: `.<name>.<host>-<pid>-<token>.staging`, removed as above) and renamed into place in one step
(`publish_folder`): it appears whole or not at all. Appending to a log (`open_for_append`) opens with O_NOFOLLOW: a
link there is refused, not written through.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import secrets
import shutil
import signal
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

PARTIAL = ".partial"  # a temporary file's suffix
STAGING = ".staging"  # a staging folder's (never `.partial`: a checkpoints/ folder's clean-up unlinks those)
HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]  # names stay short whatever the host's name
# O_TMPFILE is refused by these where the file system (or an old kernel) lacks it: the named fallback
NO_TMPFILE = (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT)
RENAME_NOREPLACE = 1  # linux/fs.h
AT_FDCWD, AT_SYMLINK_FOLLOW = -100, 0x400  # linux/fcntl.h
LIBC = ctypes.CDLL(None, use_errno=True)


def publish_bytes(path: Path, data: bytes | memoryview, replace: bool = True) -> Path:
    """`data` as the file `path`, whole or not at all (module docstring)."""
    with published(path, "wb", replace=replace) as handle:
        handle.write(data)
    return path


def publish_text(path: Path, text: str, replace: bool = True, encoding: str = "utf-8") -> Path:
    """`text` as the file `path`, whole or not at all (module docstring)."""
    return publish_bytes(path, text.encode(encoding), replace=replace)


@contextlib.contextmanager
def published(
    path: Path, mode: str = "wb", replace: bool = True, encoding: str | None = None, newline: str | None = None
) -> Iterator[IO[Any]]:
    """A new file object (`mode` "wb" or "w") whose content is published as `path` when the block ends without an
    exception; otherwise nothing is published and no temporary file is left."""
    if mode not in ("wb", "w"):
        raise ValueError(f"published: mode {mode!r}, not 'wb' or 'w'")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(path.parent, path.name)
    fd, named = temporary_file(path)
    try:
        with os.fdopen(fd, mode, closefd=False, encoding=encoding if mode == "w" else None, newline=newline) as handle:
            yield handle
            handle.flush()
        os.fsync(fd)  # a delayed ENOSPC (ext4, NFS) is reported here, before the file is published
        if named is None and not replace and linked(fd, path):
            return
        if named is None:  # a name of its own first: a rename is what replaces an entry in one step
            named = partial_name(path)
            if not linked(fd, named):  # /proc refuses the link here: the content copied into the named file
                copy_into(fd, named)
        publish_named(named, path, replace)
    finally:
        os.close(fd)
        if named is not None:
            with contextlib.suppress(FileNotFoundError):
                named.unlink()


def temporary_file(path: Path) -> tuple[int, Path | None]:
    """A descriptor of a new, empty file in `path`'s folder: unnamed (O_TMPFILE) where the file system has it (and
    /proc to link it from), else a named `.partial` file (its path returned)."""
    tmpfile = getattr(os, "O_TMPFILE", 0)
    if tmpfile and hasattr(LIBC, "linkat"):
        try:
            fd = os.open(path.parent, tmpfile | os.O_RDWR | os.O_CLOEXEC, 0o666)
        except OSError as err:
            if err.errno not in NO_TMPFILE:
                raise
        else:
            if os.path.exists(proc_link(fd)):
                return fd, None
            os.close(fd)  # no /proc to link it from: named instead
    named = partial_name(path)
    return os.open(named, NEW_FILE | os.O_RDWR, 0o666), named  # 0o666: the umask gives the file its usual mode


NEW_FILE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def proc_link(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


def linked(fd: int, path: Path) -> bool:
    """The unnamed file `fd` linked as `path` by linkat(2) through /proc (AT_SYMLINK_FOLLOW: the file, not /proc's
    magic link, which Python's os.link would link and fail); False where that is refused, FileExistsError for an
    entry at `path`."""
    if LIBC.linkat(AT_FDCWD, os.fsencode(proc_link(fd)), AT_FDCWD, os.fsencode(path), AT_SYMLINK_FOLLOW) == 0:
        return True
    code = ctypes.get_errno()
    if code == errno.EEXIST:
        raise FileExistsError(code, os.strerror(code), str(path))
    return False


def copy_into(fd: int, named: Path) -> None:
    """The unnamed file's content copied into a new file `named` (O_EXCL | O_NOFOLLOW), fsynced."""
    target = os.open(named, NEW_FILE | os.O_WRONLY, 0o666)
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        while chunk := os.read(fd, 1 << 20):
            view = memoryview(chunk)
            while view:
                view = view[os.write(target, view) :]
        os.fsync(target)
    finally:
        os.close(target)


def publish_named(named: Path, path: Path, replace: bool) -> None:
    """The whole temporary file `named` given the name `path`: renamed over it, or linked where nothing is."""
    if replace:
        os.replace(named, path)
        return
    try:
        os.link(named, path)
    except OSError as err:
        if err.errno == errno.EEXIST:
            raise
        if os.path.lexists(path):  # a file system without hard links: the check, then the rename
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path)) from None
        os.replace(named, path)


def partial_name(path: Path, suffix: str = PARTIAL) -> Path:
    """`.<name>.<host>-<pid>-<token><suffix>` beside `path`: hidden, unique, and saying which process made it."""
    return path.with_name(f".{path.name}.{HOST}-{os.getpid()}-{secrets.token_hex(4)}{suffix}")


def remove_stale_partials(folder: Path, name: str) -> list[Path]:
    """The temporary files and staging folders of `name` in `folder` that a process of this host left when it was
    killed outright (it is gone), removed; another host's, or a live process's, are left alone."""
    removed = []
    prefix = f".{name}."
    try:
        entries = [entry for entry in os.scandir(folder) if entry.name.startswith(prefix)]
    except FileNotFoundError:
        return removed
    for entry in entries:
        suffix = next((s for s in (PARTIAL, STAGING) if entry.name.endswith(s)), None)
        owner = entry.name[len(prefix) :].removesuffix(suffix or "").split("-")
        if suffix is None or len(owner) != 3 or owner[0] != HOST or not owner[1].isdigit():
            continue
        if process_alive(int(owner[1])):
            continue
        with contextlib.suppress(FileNotFoundError):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        removed.append(Path(entry.path))
    return removed


def process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


@contextlib.contextmanager
def staging_folder(target: Path) -> Iterator[Path]:
    """A new hidden folder beside `target` (the same file system, so publishing it is a rename), removed with what
    it holds unless `publish_folder` moved it into place; a killed process's is removed by the next one."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(target.parent, target.name)
    folder = partial_name(target, STAGING)
    folder.mkdir()  # mode 0o777 less the umask: the folder it becomes has the usual mode
    try:
        yield folder
    finally:
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder, ignore_errors=True)


def publish_folder(staging: Path, target: Path, replace_empty: bool = False) -> None:
    """`staging` renamed to `target` in one step. An entry at `target` is refused (FileExistsError), except, with
    `replace_empty`, an empty folder (which the caller made or checked empty, and holds the lock of)."""
    if replace_empty:
        try:
            os.rename(staging, target)  # replaces an empty folder; a folder not empty: ENOTEMPTY
        except OSError as err:
            if err.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise FileExistsError(err.errno, f"{target} is not an empty folder", str(target)) from None
            raise
        return
    if rename_noreplace(staging, target):
        return
    if os.path.lexists(target):  # no renameat2 here: the check, then the rename (a folder not empty is refused)
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target))
    os.rename(staging, target)


def rename_noreplace(source: Path, target: Path) -> bool:
    """Linux's renameat2(RENAME_NOREPLACE): True once renamed; FileExistsError for an entry at `target`; False where
    the system has no such call (then the caller checks and renames)."""
    renameat2 = getattr(LIBC, "renameat2", None)
    if renameat2 is None:  # glibc before 2.28, or another libc
        return False
    result = renameat2(AT_FDCWD, os.fsencode(source), AT_FDCWD, os.fsencode(target), RENAME_NOREPLACE)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code == errno.EEXIST:
        raise FileExistsError(code, os.strerror(code), str(target))
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):  # the kernel or the file system lacks it
        return False
    raise OSError(code, os.strerror(code), str(target))


def open_for_append(path: Path, encoding: str = "utf-8") -> IO[str]:
    """`path` opened to append text (created if missing), never through a link: a link there is refused (ELOOP),
    and so is anything but a regular file."""
    # O_NONBLOCK: a FIFO planted there fails at once (ENXIO) instead of waiting for a reader
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(path, flags, 0o666)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return os.fdopen(fd, "a", encoding=encoding)


@contextlib.contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """SIGTERM (a scheduler's or `kill`'s) raised as SystemExit(143) in the main thread while the block runs, so the
    writes in it remove their temporary files as for any other exception; the previous handler back after."""
    if threading.current_thread() is not threading.main_thread():  # Python sets handlers there only
        yield
        return
    previous: Callable[..., Any] | int | None = signal.getsignal(signal.SIGTERM)

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
