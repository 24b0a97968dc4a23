"""One rule for every output: bertforge replaces only what the same command wrote, and only with --overwrite.

Every command that writes claims its destination before any work:

- **never an input**: a destination that is (or, for a directory, contains) something the command
  reads is refused;
- **never a stranger's file**: each directory bertforge writes into keeps a ledger,
  `.bertforge-outputs.json`, of the names in it that bertforge wrote and which command wrote each.
  A name not in it is someone else's and is never replaced or deleted. An output written before
  ledgers existed is recognised by its files (the command's `recognise`) and adopted;
- **an earlier output of the same command needs --overwrite** to be replaced (a command that
  continues its own output instead -- `prepare` with the same inputs, `glue`, a run directory --
  passes `overwrite=None` and decides itself);
- **staging of an interrupted run is removed by the next one**: every output is written under
  `.NAME.tmp-PID` beside it and renamed into place, so a kill -9 leaves only such names, which the
  next run removes once process PID is gone.

A directory output (export, prepare, tokenizer train, glue, a run directory) is owned whole: it must
be missing, empty, or hold only its command's earlier output. A file output (predict, embed,
evaluate --out-dir, plot) shares its directory with other files: only its own name is checked. An
object-store prefix follows the directory rules, its ledger an object under the prefix.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bertforge.console import log
from bertforge.directory_lock import LOCK_NAME
from bertforge.errors import BertforgeError
from bertforge.run_directory import is_run_listing
from bertforge.storage import filesystem, is_remote, storage_errors, with_retries

LEDGER_NAME = ".bertforge-outputs.json"
LEDGER_FORMAT = "bertforge-outputs"
NOT_OUTPUTS = frozenset({LEDGER_NAME, LOCK_NAME})  # bookkeeping, not anyone's output
SHOWN_NAMES = 6

# a source of the command and what to call it in a message ("the model being exported", "the --input file")
Source = tuple["str | Path", str]


# ---------------------------------------------------------------------------------------------
# staging left by a killed run


def process_is_gone(pid: int) -> bool:
    """No process `pid` on this machine (a live one of another user still counts as live)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def staging_path(target: Path) -> Path:
    """Where this process writes `target` before renaming it into place (`remove_stale_staging` knows the name)."""
    return target.with_name(f".{target.name}.tmp-{os.getpid()}")


STAGING_NAME = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)")


def remove_stale_staging(target: Path, *, everything_in: Path | None = None) -> list[Path]:
    """Remove the `.NAME.tmp-PID` siblings of `target` (NAME its name) whose process is gone, and the
    `.NAME.old-PID` an interrupted swap left once NAME exists again (until then it is the only copy).
    With `everything_in`, do so for every NAME in that directory instead."""
    directory = everything_in or target.parent
    if not directory.is_dir():
        return []
    removed = []
    for entry in directory.iterdir():
        match = STAGING_NAME.fullmatch(entry.name)
        if match is None or (everything_in is None and match["name"] != target.name):
            continue
        if not process_is_gone(int(match["pid"])):
            continue
        if match["kind"] == "old" and not (directory / match["name"]).exists():
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    if removed:
        log.info(f"removed what an interrupted earlier run left: {', '.join(str(path) for path in removed)}")
    return removed


def replace_file(target: Path, write: Callable[[Path], None]) -> Path:
    """`write(staging)` then rename it to `target`: a reader, or a kill, never leaves half a file there."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_path(target)
    try:
        write(staging)
        os.replace(staging, target)
    finally:
        staging.unlink(missing_ok=True)
    return target


# ---------------------------------------------------------------------------------------------
# the ledger: which names in a directory bertforge wrote, and by which command


def _join(location: str, name: str) -> str:
    return f"{location.rstrip('/')}/{name}"


@contextlib.contextmanager
def _directory_locked(directory: Path) -> Iterator[None]:
    """Two commands writing into one directory at once (two `predict`s) must not lose each other's entries."""
    handle = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)


@dataclass
class Ledger:
    """`location/.bertforge-outputs.json`: {name: command} for the names bertforge wrote there."""

    location: str

    def read(self) -> dict[str, str]:
        try:
            if is_remote(self.location):
                fs, root = filesystem(self.location)
                with storage_errors(self.location, "read"):
                    text = fs.cat_file(_join(root, LEDGER_NAME)).decode("utf-8")
            else:
                text = (Path(self.location) / LEDGER_NAME).read_text(encoding="utf-8")
            data = json.loads(text)
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return {}
        written = data.get("written_by") if isinstance(data, dict) and data.get("format") == LEDGER_FORMAT else None
        return {str(k): str(v) for k, v in written.items()} if isinstance(written, dict) else {}

    def update(self, added: dict[str, str] | None = None, removed: Iterable[str] = ()) -> None:
        if is_remote(self.location):
            self._write(self._changed(self.read(), added, removed))
            return
        directory = Path(self.location)
        directory.mkdir(parents=True, exist_ok=True)
        with _directory_locked(directory):
            self._write(self._changed(self.read(), added, removed))

    @staticmethod
    def _changed(entries: dict[str, str], added: dict[str, str] | None, removed: Iterable[str]) -> dict[str, str]:
        for name in removed:
            entries.pop(name, None)
        entries.update(added or {})
        return entries

    def _write(self, entries: dict[str, str]) -> None:
        if not entries:  # nothing of ours is left there: no ledger either
            self._remove()
            return
        data = json.dumps({"format": LEDGER_FORMAT, "version": 1, "written_by": dict(sorted(entries.items()))},
                          indent=1) + "\n"
        if is_remote(self.location):
            fs, root = filesystem(self.location)
            with_retries(_join(self.location, LEDGER_NAME), "upload",
                         lambda: fs.pipe_file(_join(root, LEDGER_NAME), data.encode("utf-8")))
            return
        replace_file(Path(self.location) / LEDGER_NAME, lambda staging: staging.write_text(data, encoding="utf-8"))

    def _remove(self) -> None:
        if is_remote(self.location):
            fs, root = filesystem(self.location)
            with storage_errors(self.location, "clean up"), contextlib.suppress(FileNotFoundError):
                fs.rm(_join(root, LEDGER_NAME))
            return
        (Path(self.location) / LEDGER_NAME).unlink(missing_ok=True)


def record_outputs(directory: str | Path, names: Iterable[str], command: str) -> None:
    """Note in `directory`'s ledger that `command` wrote `names` there."""
    Ledger(str(directory)).update({name: command for name in names})


# ---------------------------------------------------------------------------------------------
# claims


def _listed(names: Sequence[str], directories: set[str]) -> str:
    shown = [name + ("/" if name in directories else "") for name in sorted(names)[:SHOWN_NAMES]]
    more = f" and {len(names) - SHOWN_NAMES} more" if len(names) > SHOWN_NAMES else ""
    return ", ".join(shown) + more


def _check_parents(path: Path, flag: str) -> None:
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise BertforgeError(f"{flag} {path}: {parent} is a file, not a directory; choose another path")
            return


def _refuse_inputs(out: str | Path, sources: Iterable[Source], flag: str, directory: bool) -> None:
    """`out` is never a source, and (a directory, replaced or cleaned) never holds one."""
    if is_remote(out):
        target = str(out).rstrip("/")
        for source, role in sources:
            text = str(source).rstrip("/")
            if text == target or (directory and text.startswith(target + "/")):
                raise BertforgeError(f"{flag} {out} {'is' if text == target else 'contains'} {role}; writing there "
                                     "would destroy it. Choose a new path")
        return
    destination = Path(out).expanduser().resolve()
    for source, role in sources:
        if is_remote(source):
            continue
        path = Path(source).expanduser().resolve()
        same = destination == path or (destination.exists() and path.exists() and os.path.samefile(destination, path))
        if same or (directory and destination in path.parents):
            what = f"is {role}" if same else f"contains {role} ({path})"
            raise BertforgeError(f"{flag} {out} {what}; writing there would destroy it. Choose a new path, e.g. "
                                 f"{flag} {destination.parent / ('new-' + destination.name)}")


def _contents(location: str) -> tuple[list[str], set[str]] | None:
    """The names directly under a directory or prefix (and which of them are directories); None when missing."""
    if is_remote(location):
        fs, root = filesystem(location)
        root = root.rstrip("/")
        with storage_errors(location, "list"):
            try:
                found = fs.find(root)
            except FileNotFoundError:  # s3fs: no such prefix; a missing bucket is refused by storage_errors
                found = []
        relative = [path[len(root) + 1:] for path in found if path.startswith(root + "/")]
        names = sorted({path.split("/", 1)[0] for path in relative})
        return names, {path.split("/", 1)[0] for path in relative if "/" in path}
    directory = Path(location)
    if not directory.exists():
        return None
    entries = list(directory.iterdir())
    return sorted(entry.name for entry in entries), {entry.name for entry in entries if entry.is_dir()}


@dataclass
class ClaimedDirectory:
    """A directory (or prefix) a command may write into; `earlier` names its earlier output there."""

    location: str
    command: str
    earlier: list[str] = field(default_factory=list)
    adopted: bool = False  # an output from before ledgers, recognised by its files

    @property
    def ledger(self) -> Ledger:
        return Ledger(self.location)

    def record(self, *names: str) -> None:
        """Note names this command writes (before writing them: a kill then leaves nothing unaccounted)."""
        carried = {name: self.command for name in self.earlier} if self.adopted else {}
        self.ledger.update({**carried, **{name: self.command for name in names}})
        self.adopted = False

    def forget(self, *names: str) -> None:
        """Names recorded before they were written that a failed run removed again."""
        self.ledger.update(removed=names)

    def remove_earlier(self, keep: Iterable[str], matching: Callable[[str], bool] = lambda name: True) -> list[str]:
        """Delete the earlier output's names (recorded by this command) that `matching` selects, except `keep`."""
        kept = set(keep)
        mine = {name for name, by in self.ledger.read().items() if by == self.command} | set(self.earlier)
        doomed = sorted(name for name in mine if name not in kept and name not in NOT_OUTPUTS and matching(name))
        if is_remote(self.location):
            fs, root = filesystem(self.location)
            with storage_errors(self.location, "clean up the earlier output in"):
                for name in doomed:
                    with contextlib.suppress(FileNotFoundError):
                        fs.rm(_join(root, name), recursive=True)
        else:
            for name in doomed:
                path = Path(self.location) / name
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        self.ledger.update(removed=doomed)
        self.earlier = [name for name in self.earlier if name not in doomed]
        return doomed

    def refuse_earlier_unless(self, overwrite: bool, flag: str, what: str) -> None:
        if self.earlier and not overwrite:
            raise BertforgeError(f"{flag} {self.location} holds an earlier {what} "
                                 f"({_listed(self.earlier, set())}); pass --overwrite to replace it, or choose a new "
                                 f"{'prefix' if is_remote(self.location) else 'directory'}")


def claim_directory(out: str | Path, *, command: str, flag: str, what: str, overwrite: bool | None,
                    sources: Iterable[Source] = (), recognise: Callable[[list[str], set[str]], bool] | None = None,
                    kin: Iterable[str] = ()) -> ClaimedDirectory:
    """Check that `command` may write the directory or prefix `out` before it does any work.

    `what` names the output in messages ("export", "dataset"); `kin` are other commands whose output
    this one may replace (`prepare merge` and `prepare pretrain` both write a dataset); `recognise`
    tells an output from before ledgers by its names (and which of them are directories). `overwrite=None` leaves the decision on an
    earlier output to the caller (`ClaimedDirectory.refuse_earlier_unless`).
    """
    remote = is_remote(out)
    location = str(out).rstrip("/") if remote else str(Path(out).expanduser())
    _refuse_inputs(out, sources, flag, directory=True)
    if not remote:
        path = Path(location)
        if path.exists() and not path.is_dir():
            raise BertforgeError(f"{flag} {out} is a file, not a directory; choose a directory path for the {what}")
        _check_parents(path, flag)
    contents = _contents(location)
    claimed = ClaimedDirectory(location, command)
    if contents is None:
        if not remote:
            remove_stale_staging(Path(location))  # beside it: a whole directory staged by an export
        return claimed
    names, directories = contents
    names = [name for name in names if name not in NOT_OUTPUTS and not STAGING_NAME.fullmatch(name)]
    ledger = Ledger(location).read()
    owners = {command, *kin}
    strangers = [name for name in names if name not in ledger]
    if strangers and not ledger and recognise is not None and recognise(names, directories):
        claimed.earlier, claimed.adopted = names, True
        strangers = []
    new = "prefix" if remote else "directory"
    if strangers:
        raise BertforgeError(f"{flag} {out} is not empty and is not an earlier {what} (it holds "
                             f"{_listed(strangers, directories)}); bertforge never replaces or deletes what it did "
                             f"not write, so choose a new or empty {new}")
    others = sorted({ledger[name] for name in names if ledger.get(name) not in owners and name in ledger})
    if others:
        raise BertforgeError(f"{flag} {out} holds the output of `bertforge {others[0]}`, not an earlier {what}; "
                             f"choose a new or empty {new}")
    if not claimed.adopted:
        claimed.earlier = [name for name in names if ledger.get(name) in owners]
    if overwrite is not None:
        claimed.refuse_earlier_unless(overwrite, flag, what)
    if not remote:  # once the claim holds: a refused command changes nothing
        remove_stale_staging(Path(location))  # beside it: a whole directory staged by an export
        remove_stale_staging(Path(location), everything_in=Path(location))  # files staged inside it
    return claimed


def claim_file(out: str | Path, *, command: str, flag: str, what: str, overwrite: bool,
               sources: Iterable[Source] = (), recognise: Callable[[Path], bool] | None = None,
               example_name: str = "output") -> Path:
    """Check that `command` may write the file `out`: not a directory, not a source, and if it exists,
    an earlier output of this command (by its directory's ledger, else `recognise`) and `overwrite`."""
    target = Path(out).expanduser()
    if target.is_dir():
        raise BertforgeError(f"{flag} {out} is a directory; give a file path, e.g. {flag} {target / example_name}")
    _check_parents(target, flag)
    _refuse_inputs(out, sources, flag, directory=False)
    if not target.exists():
        remove_stale_staging(target)
        return target
    recorded = Ledger(str(target.parent)).read().get(target.name)
    if recorded == command or (recorded is None and recognise is not None and recognise(target)):
        if overwrite:
            remove_stale_staging(target)
            return target
        raise BertforgeError(f"{flag} {out} exists; add --overwrite to replace this earlier {what}, or choose another "
                             "path")
    if recorded is not None:
        raise BertforgeError(f"{flag} {out} was written by `bertforge {recorded}`, not `bertforge {command}`; choose "
                             "another path")
    raise BertforgeError(f"{flag} {out} exists and is not an earlier {what}; bertforge never replaces a file it did "
                         "not write, so choose another path (or move the file away)")


def output_directory(path: str | Path, flag: str) -> Path:
    """A directory a command writes into (file outputs are claimed one by one): missing or a directory."""
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        raise BertforgeError(f"{flag} {path} is a file; give a directory (created if missing)")
    _check_parents(target, flag)
    return target


# ---------------------------------------------------------------------------------------------
# run directories

WHOLE_DIRECTORY = "."  # a ledger entry: every name in the directory is the command's (a run directory)
TRAINING_COMMANDS = ("pretrain", "finetune", "train")


def claim_run_directory(run_dir: str | Path, command: str, *, record: bool = True) -> None:
    """A run directory belongs to the trainer whole (config, metrics, checkpoints, reports, final/): it must
    be missing, empty, or an earlier run, which the trainer resumes (`run.resume`). A directory of anything
    else is refused before the trainer writes into it. `record` is False on the ranks other than 0."""
    path = Path(run_dir).expanduser()
    flag = "run.output_dir/run.name"
    if path.exists() and not path.is_dir():
        raise BertforgeError(f"{flag} {run_dir} is a file, not a directory; choose another run.name")
    _check_parents(path, flag)
    contents = _contents(str(path)) or ([], set())
    names = [name for name in contents[0] if name not in NOT_OUTPUTS and not STAGING_NAME.fullmatch(name)]
    ledger = Ledger(str(path)).read()
    owner = ledger.get(WHOLE_DIRECTORY)
    if owner is not None and owner not in TRAINING_COMMANDS:
        raise BertforgeError(f"{flag} {run_dir} holds the output of `bertforge {owner}`, not a run; choose another "
                             "run.name or run.output_dir")
    earlier_run = is_run_listing(contents[0])  # a run from before the ledger
    if owner is None and names and not earlier_run:
        raise BertforgeError(f"{flag} {run_dir} is not empty and is not a run directory (it holds "
                             f"{_listed(names, contents[1])}); bertforge never writes into a directory of files it "
                             "did not write: choose another run.name or run.output_dir")
    if record and owner is None and path.is_dir():  # a missing one is left to the trainer to create
        Ledger(str(path)).update({WHOLE_DIRECTORY: command})
