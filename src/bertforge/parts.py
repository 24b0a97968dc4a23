"""A corpus split across machines: `predict` / `embed` / `fill-mask --num-parts N --part I` (a Slurm array).

Part I of N runs the input rows [I*R//N, (I+1)*R//N) of its R rows: contiguous, so the parts' files read in
part order are the one-machine output row for row, ids included (an output row's id is its input row's id
column, else its row number in the whole input). Each part writes its own file beside --out, named
`preds.part-00003-of-00016.jsonl` for `--out preds.jsonl`: zero-padded so a listing sorts in part order, the
count in the name so the parts of another split never pass for this one's, the suffix kept so the format
is still the suffix's.

Resumable without a marker that can lie: a part's file appears whole or not at all (written under a staging
name and renamed; an object store's PUT is atomic), and a rerun that finds it skips it only after reading
that it holds exactly this part's rows (their ids; for a .npy, its row count).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError

PART_DIGITS = 5  # up to 99,999 parts, names still sorting in part order


def add_part_arguments(parser: argparse.ArgumentParser) -> None:
    """`--num-parts N --part I` (shared by `predict`, `embed` and `fill-mask`)."""
    parser.add_argument("--num-parts", type=int, default=None, metavar="N",
                        help="split the input into N contiguous parts by row; this run does only --part I and writes "
                             "OUT's name with .part-0000I-of-0000N before its suffix (a finished part is skipped)")
    parser.add_argument("--part", type=int, default=None, metavar="I",
                        help="which part (0..N-1) this run does, with --num-parts (a Slurm array's "
                             "$SLURM_ARRAY_TASK_ID)")


@dataclass(frozen=True)
class RowPart:
    """Part `index` of `count` of an input's rows."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1:
            raise BertforgeError(f"--num-parts {self.count}: give at least 1 part, e.g. --num-parts 16 --part 0")
        if not 0 <= self.index < self.count:
            raise BertforgeError(f"--part {self.index} --num-parts {self.count}: the part must be in 0..{self.count - 1}"
                                 f" (Slurm: --array=0-{self.count - 1} and --part $SLURM_ARRAY_TASK_ID)")

    def rows(self, total: int) -> range:
        """This part's rows of `total`: the parts in order cover them once, their sizes differing by 1 at most."""
        return range(total * self.index // self.count, total * (self.index + 1) // self.count)

    def output_of(self, out: str) -> str:
        """`preds.jsonl` -> `preds.part-00003-of-00016.jsonl` (a path or a URL)."""
        head, slash, name = str(out).rpartition("/")
        stem, dot, suffix = name.rpartition(".")
        if not dot or not stem:
            stem, suffix = name, ""
        tag = f"part-{self.index:0{PART_DIGITS}d}-of-{self.count:0{PART_DIGITS}d}"
        return f"{head}{slash}{stem}.{tag}{'.' + suffix if suffix else ''}"


def part_of(args: argparse.Namespace) -> RowPart | None:
    """The part `--num-parts` and `--part` name, or None without them (checked before any work)."""
    if args.num_parts is None and args.part is None:
        return None
    if args.num_parts is None or args.part is None:
        given, missing = ("--part", "--num-parts") if args.num_parts is None else ("--num-parts", "--part")
        raise BertforgeError(f"{given} needs {missing}: give both, e.g. --num-parts 16 --part 0 (Slurm: --part "
                             "$SLURM_ARRAY_TASK_ID)")
    return RowPart(args.part, args.num_parts)


def check_out_without_parts(out: str | None, part: RowPart | None) -> None:
    """A bucket is written through parts (`store`); a run without --num-parts writes a local file, and an s3://
    --out given to one would become a local directory named `s3:`."""
    from bertforge.storage import is_remote

    if part is None and out is not None and is_remote(out):
        raise BertforgeError(f"--out {out}: a run without --num-parts writes a local file; to write to a bucket add "
                             f"--num-parts 1 --part 0 (it writes {RowPart(0, 1).output_of(out)})")


def row_ids(ids: Sequence[Any] | None, total: int) -> list[Any]:
    """Each input row's id: its id column's value, else its row number (0-based, as .npy's row i is text i)."""
    return list(ids) if ids is not None else list(range(total))


# ---------------------------------------------------------------------------------------------
# is a part already done?


def stored_ids(location: str) -> list[Any] | None:
    """The `id` column of a .parquet or .jsonl output (None: it has none, or cannot be read whole)."""
    import fsspec
    import pyarrow.parquet as pq

    try:
        with fsspec.open(location, "rb") as handle:
            if location.endswith(".parquet"):
                stored = pq.ParquetFile(handle)
                if "id" not in stored.schema_arrow.names:
                    return None
                return stored.read(columns=["id"]).column("id").to_pylist()  # the ids only, not the outputs
            rows = [json.loads(line) for line in handle.read().decode("utf-8").splitlines()]
    except (OSError, ValueError, KeyError):  # torn or foreign: not a finished part (pyarrow's errors are ValueErrors)
        return None
    if not all(isinstance(row, dict) and "id" in row for row in rows):
        return None
    return [row["id"] for row in rows]


def stored_rows(location: str) -> int | None:
    """The number of rows of a .npy matrix, from its header (None: not a readable .npy)."""
    import fsspec
    import numpy as np

    try:
        with fsspec.open(location, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(handle)
            data_start = handle.tell()
            handle.seek(0, 2)
            data_bytes = handle.tell() - data_start
    except (OSError, ValueError):
        return None
    whole = len(shape) == 2 and data_bytes == shape[0] * shape[1] * dtype.itemsize  # not cut short
    return int(shape[0]) if whole else None


def holds_rows(location: str, ids: Sequence[Any]) -> bool:
    """Does the file at `location` hold exactly these rows (by id; a .npy by count)?"""
    if location.endswith(".npy"):
        return stored_rows(location) == len(ids)
    return stored_ids(location) == list(ids)


# ---------------------------------------------------------------------------------------------
# claiming and writing a part's file, local or in an object store


def _parent_and_name(location: str) -> tuple[str, str]:
    from bertforge.storage import is_remote

    if is_remote(location):
        parent, _, name = location.rpartition("/")
        return parent, name
    path = Path(location).expanduser()
    return str(path.parent), path.name


def _exists(location: str) -> bool:
    from bertforge.storage import filesystem, is_remote, with_retries

    if not is_remote(location):
        return Path(location).expanduser().is_file()
    fs, path = filesystem(location)
    return bool(with_retries(location, "read", lambda: fs.exists(path)))


def claim_part(location: str, ids: Sequence[Any], *, command: str, what: str, overwrite: bool,
               sources: Sequence[tuple[str | Path, str]]) -> bool:
    """May `command` write this part's file? False when an earlier run of it finished the part (the caller
    skips it); an error when the name holds anything else that --overwrite may not or cannot replace."""
    from bertforge.output_guard import Ledger, claim_file
    from bertforge.storage import is_remote

    parent, name = _parent_and_name(location)
    exists = _exists(location)
    recorded = Ledger(parent).read().get(name) if exists else None
    finished = exists and recorded in (None, command) and holds_rows(location, ids)
    if finished and not overwrite:
        return False
    if not is_remote(location):
        claim_file(location, command=command, flag="--out", what=what, overwrite=overwrite, sources=sources,
                   recognise=lambda path: holds_rows(str(path), ids), example_name=name)
        return True
    for source, role in sources:
        if str(source).rstrip("/") == location:
            raise BertforgeError(f"--out {location} is {role}; writing there would destroy it. Choose a new path")
    if not exists:
        return True
    if recorded is not None and recorded != command:
        raise BertforgeError(f"--out {location} was written by `bertforge {recorded}`, not `bertforge {command}`; "
                             "choose another path")
    if recorded is None and not finished:
        raise BertforgeError(f"--out {location} exists and is not an earlier {what}; bertforge never replaces an "
                             "object it did not write, so choose another path")
    if not overwrite:
        raise BertforgeError(f"--out {location} holds other rows than this part's (another input or --num-parts); "
                             f"add --overwrite to replace this earlier {what}, or choose another path")
    return True


def store(location: str, write: Callable[[Path], Path], command: str) -> str:
    """`write(path)` (which writes `path` whole or not at all) into `location`, and note it in the ledger beside it.
    An object is written to a local file first and uploaded in one PUT: it too appears whole or not at all."""
    from bertforge.output_guard import record_outputs
    from bertforge.storage import filesystem, is_remote, with_retries

    parent, name = _parent_and_name(location)
    if not is_remote(location):
        write(Path(location).expanduser())
    else:
        fs, path = filesystem(location)
        with tempfile.TemporaryDirectory(prefix="bertforge-part-") as staging:
            local = write(Path(staging) / name)
            with_retries(location, "upload", lambda: fs.put_file(str(local), path))
    # parts finishing at once may race on an object store's ledger (read, change, write): a lost entry costs
    # nothing, since a rerun recognises a finished part by its rows
    record_outputs(parent, [name], command)
    return location
