"""Reading and writing trace files: JSON Lines (the native form, optionally gzipped) and CSV.

CSV keeps the header as a first comment line (``# otela_trace {...}``; pandas reads the rest
with ``comment="#"``), so JSONL -> CSV -> JSONL is lossless for every schema field. Unknown
keys (`extra`) travel as a JSON object in the ``extra`` column.
"""

from __future__ import annotations

import csv
import gzip
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from otela.tracing.schema import (
    COLUMNS,
    HEADER_KEY,
    TraceError,
    TraceRecord,
    check_header,
    make_header,
    record_from_json,
)


@dataclass
class Trace:
    """A header (schema version, start time, provenance) and records sorted by arrival."""

    header: dict[str, Any] = field(default_factory=lambda: make_header("otela"))
    records: list[TraceRecord] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.records)

    @property
    def duration(self) -> float:
        return self.records[-1].arrival - self.records[0].arrival if self.records else 0.0

    def sorted(self) -> Trace:
        return Trace(dict(self.header), sorted(self.records, key=lambda r: r.arrival))


def _open_text(path: Path, mode: str) -> IO[str]:
    if path.suffix == ".gz":
        return cast(IO[str], gzip.open(path, mode + "t", encoding="utf-8"))
    return path.open(mode, encoding="utf-8", newline="" if path.suffix == ".csv" else None)


def is_csv(path: Path) -> bool:
    return path.suffix == ".csv" or path.name.endswith(".csv.gz")


def read_trace(path: str | Path) -> Trace:
    """Read an otela trace (JSONL, JSONL.gz or CSV); raise TraceError with the line on error."""
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such file")
    try:
        with _open_text(p, "r") as fh:
            return _read_csv(fh, str(p)) if is_csv(p) else _read_jsonl(fh, str(p))
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile) as e:
        raise TraceError(f"{p}: cannot read ({e})") from e


def _read_jsonl(fh: IO[str], name: str) -> Trace:
    header: dict[str, Any] | None = None
    records: list[TraceRecord] = []
    for n, line in enumerate(fh, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"{name}:{n}: not JSON ({e.msg})") from e
        if header is None:
            header = check_header(obj, f"{name}:{n}")
            continue
        records.append(record_from_json(obj, f"{name}:{n}"))
    if header is None:
        raise TraceError(f"{name}: empty file (no otela trace header)")
    return Trace(header, records).sorted()


def _read_csv(fh: IO[str], name: str) -> Trace:
    first = fh.readline()
    prefix = f"# {HEADER_KEY} "
    if not first.startswith(prefix):
        raise TraceError(f"{name}:1: not an otela CSV trace (first line must be '{prefix}{{...}}')")
    try:
        header = check_header(json.loads(first[len(prefix) :]), f"{name}:1")
    except json.JSONDecodeError as e:
        raise TraceError(f"{name}:1: header is not JSON ({e.msg})") from e
    records = []
    for n, row in enumerate(csv.DictReader(fh), 3):
        obj: dict[str, Any] = {k: v for k, v in row.items() if k and k != "extra" and v != ""}
        if row.get("extra"):
            try:
                obj.update(json.loads(row["extra"]))
            except json.JSONDecodeError as e:
                raise TraceError(f"{name}:{n}: 'extra' is not JSON") from e
        records.append(record_from_json(obj, f"{name}:{n}"))
    return Trace(header, records).sorted()


def iter_jsonl_lines(header: dict[str, Any], records: Iterable[TraceRecord]) -> Iterator[str]:
    """The lines of a JSONL trace file, header first (used by writers and the recorder)."""
    yield json.dumps(header, separators=(",", ":")) + "\n"
    for r in records:
        yield json.dumps(r.to_json(), separators=(",", ":")) + "\n"


def write_trace(path: str | Path, trace: Trace) -> Path:
    """Write JSONL (``.jsonl``/``.jsonl.gz``) or CSV (``.csv``) by the file's suffix."""
    p = Path(path)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    with _open_text(p, "w") as fh:
        if is_csv(p):
            _write_csv(fh, trace)
        else:
            fh.writelines(iter_jsonl_lines(trace.header, trace.records))
    return p


def _write_csv(fh: IO[str], trace: Trace) -> None:
    fh.write(f"# {HEADER_KEY} " + json.dumps(trace.header, separators=(",", ":")) + "\n")
    writer = csv.DictWriter(fh, fieldnames=[*COLUMNS, "extra"], lineterminator="\n")
    writer.writeheader()
    for r in trace.records:
        row: dict[str, Any] = {
            k: ("" if v is None else v) for k, v in r.to_json().items() if k in COLUMNS
        }
        if r.extra:
            row["extra"] = json.dumps(r.extra, separators=(",", ":"))
        writer.writerow(row)
