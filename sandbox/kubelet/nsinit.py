"""The shim and init of one isolated container: run by the sandbox as root, as ``python -I -S nsinit.py SPEC``.

It imports nothing of the sandbox (it runs as a script). ``SPEC`` is JSON: ``argv``, ``cwd``, ``uid``, ``gid``,
``groups``, ``hostname``, ``status_fd`` (closed when the command is exec'd, or given the reason it could not be), ``netns`` (a ``/run/netns/<name>`` file or null), ``binds`` (``[source, target]`` files bind-mounted
in the container's mount namespace: its /etc/hosts and /etc/resolv.conf), ``mounts`` (``[source, mountPath]``:
the pod's volumes, bound at their paths; see :func:`_mount_volume`) and ``join`` (the pid of a
container's init, for an exec into it, or null). The environment is the container's.

Three processes, as containerd's shim, the container's PID 1 and its command:

- the *shim* (this process, the one the sandbox started) enters the network namespace, unshares a PID, a
  mount and a UTS namespace (the pod's hostname) (or, for an exec, joins the container's), forwards the signals it gets to PID 1 and exits
  with its status; if the sandbox SIGKILLs it, PID 1 gets SIGKILL too (``PR_SET_PDEATHSIG``);
- *PID 1* forwards signals to the command and reaps orphans; when it exits, the kernel kills every process
  left in the namespace: nothing a container started outlives it, whatever it does with SIGTERM;
- the *command* runs as the container's user, in its working directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x04000000, 0x20000000, 0x40000000
MS_BIND, MS_REC, MS_PRIVATE, MS_NOSUID, MS_NODEV, MS_NOEXEC = 4096, 16384, 1 << 18, 2, 4, 8
PR_SET_PDEATHSIG = 1
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGWINCH)
LIBC = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _setns(paths: list[tuple[str, int]]) -> None:
    # every file opened first: once in a container's mount namespace, /proc is the container's
    fds = [(os.open(path, os.O_RDONLY), path, kind) for path, kind in paths]
    try:
        for fd, path, kind in fds:
            _check(LIBC.setns(fd, kind), f"setns {path}")
    finally:
        for fd, _path, _kind in fds:
            os.close(fd)


def _mount(source: str, target: str, fstype: str | None, flags: int) -> None:
    _check(LIBC.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags, None),
           f"mount {source} on {target}")


def _reveal(folder: str, children: list[str]) -> None:
    # an empty tmpfs over a folder the user may not enter, with only ``children`` bind-mounted back
    fds = [os.open(child, os.O_PATH) for child in children]
    _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV)
    os.chmod(folder, 0o755)
    for fd, child in zip(fds, children, strict=True):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.mkdir(child)
        else:
            open(child, "x").close()
        _mount(f"/proc/self/fd/{fd}", child, None, MS_BIND | MS_REC)
        os.close(fd)


def _cover(folder: str) -> None:
    # a tmpfs over a host folder, holding what it held (entries bound back, symlinks copied), with its mode
    # and owner: what the container then makes in it stays in the container's mount namespace
    info = os.stat(folder)
    entries = sorted(os.listdir(folder))
    links = {name: os.readlink(os.path.join(folder, name)) for name in entries
             if os.path.islink(os.path.join(folder, name))}
    under = os.open(folder, os.O_PATH)  # one descriptor: the covered entries stay reachable through it
    try:
        _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV)
        os.chmod(folder, info.st_mode & 0o7777)
        os.chown(folder, info.st_uid, info.st_gid)
        for name in entries:
            path, old = os.path.join(folder, name), f"/proc/self/fd/{under}/{name}"
            if name in links:
                os.symlink(links[name], path)
                continue
            if os.path.isdir(old):
                os.mkdir(path)
            else:
                open(path, "x").close()
            _mount(old, path, None, MS_BIND | MS_REC)
    finally:
        os.close(under)


def _mount_volume(source: str, target: str, ours: set[str]) -> None:
    """Bind ``source`` at the container path ``target``, as a runtime mounts a volume.

    The container shares the host's filesystem, so a ``target`` the host lacks (``/etc/jupyterhub/...``) is
    made on a tmpfs over its deepest existing folder (:func:`_cover`), never on the host. ``ours`` holds
    the folders already made or covered here, where new entries may be made directly.
    """
    missing = []
    folder = target
    while not os.path.lexists(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    if missing:
        if folder == "/":  # no tmpfs over the root: such a volume keeps the path mapping alone (podfiles.py)
            return
        if folder not in ours:
            _cover(folder)
            ours.add(folder)
        for path in reversed(missing):
            if path == target and not os.path.isdir(source):
                open(path, "x").close()
            else:
                os.mkdir(path, 0o755)
            ours.add(path)
    _mount(source, target, None, MS_BIND | MS_REC)


def _die_with_parent() -> None:
    _check(LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")


def _status(raw: int) -> int:
    # the exit code a kubelet reports: the process's own, or 128 + the signal that killed it
    return 128 + os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)


def _forward_to(pid: int) -> None:
    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    for sig in FORWARDED:
        signal.signal(sig, forward)


def _wait_for(pid: int, reap_all: bool) -> int:
    """Wait for ``pid`` (reaping any other child meanwhile when ``reap_all``); its exit code."""
    while True:
        try:
            done, raw = os.waitpid(-1 if reap_all else pid, 0)
        except ChildProcessError:
            return 128 + signal.SIGKILL
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            continue
        if done == pid:
            return _status(raw)


def _report(spec: dict, message: str) -> None:
    # on the status pipe: the sandbox reports it as the container's StartError
    os.write(spec["status_fd"], message.encode())
    os._exit(128)


def _command(spec: dict) -> None:
    """The container's command, as its user (never returns). Its exec closes the status pipe: started."""
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    try:
        if spec["uid"] is not None:
            os.setgroups(spec["groups"])
            os.setgid(spec["gid"])
            os.setuid(spec["uid"])
        os.chdir(spec["cwd"])
        os.set_inheritable(spec["status_fd"], False)
        os.execvp(spec["argv"][0], spec["argv"])  # an exec's command is looked up on its PATH
    except OSError as exc:
        _report(spec, f"exec: {spec['argv'][0]!r}: {exc}")


def _pid1(spec: dict, mount_proc: bool) -> None:
    """PID 1 of the container: run the command, forward signals, reap, exit with the command's code."""
    _die_with_parent()
    if mount_proc:  # `ps` in the container shows the container's processes only
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    child = os.fork()
    if child == 0:
        _command(spec)
    _forward_to(child)  # before the status pipe closes: a SIGTERM right after Running must not kill PID 1
    os.close(spec["status_fd"])
    os._exit(_wait_for(child, reap_all=True))


def main() -> None:
    spec = json.loads(sys.argv[1])
    join = spec.get("join")
    if join:
        _setns([(f"/proc/{join}/ns/{kind}", flag)
                for kind, flag in (("net", CLONE_NEWNET), ("mnt", CLONE_NEWNS), ("uts", CLONE_NEWUTS),
                                   ("pid", CLONE_NEWPID))])
    else:
        if spec.get("netns"):
            _setns([(spec["netns"], CLONE_NEWNET)])
        _check(LIBC.unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWUTS), "unshare")
        name = spec["hostname"].encode()
        _check(LIBC.sethostname(name, len(name)), "sethostname")
        _mount("none", "/", None, MS_REC | MS_PRIVATE)
        for source, target in spec.get("binds") or []:
            _mount(source, target, None, MS_BIND)
        for folder, children in spec.get("reveal") or []:
            _reveal(folder, children)
        ours: set[str] = set()
        for source, target in spec.get("mounts") or []:
            _mount_volume(source, target, ours)
    pid = os.fork()
    if pid == 0:
        if join:  # an exec: a process of the container's namespace, not a new PID 1
            _die_with_parent()
            _command(spec)
        _pid1(spec, mount_proc=True)
    _forward_to(pid)  # before the status pipe closes: the sandbox signals the shim once it reads Running
    os.close(spec["status_fd"])
    os._exit(_wait_for(pid, reap_all=False))


if __name__ == "__main__":
    try:
        main()
    except OSError as exc:
        _report(json.loads(sys.argv[1]), f"sandbox container shim: {exc}")
