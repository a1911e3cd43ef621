"""Labels of an image folder given as a CSV (``data.labels``): ``path,label`` rows for a subset of its images.

A user's folder of photos is mostly unlabelled; a few hundred of its images may be labelled in a spreadsheet. The
CSV names them: one row per image, its path (relative to ``data.root``, or absolute, inside it) and its class name
(any string). A first row whose path has no file extension (``path,label``, ``file,class``) is a header and is
skipped; blank lines are skipped. Pretraining reads every image of the folder, labelled or not; evaluation reads
the labelled ones, as a :class:`~selfsup.data.formats.folder.FolderSource` with the CSV's classes (sorted by name,
so every split agrees on them).

Splits: the labelled images inside ``data.root/<split>/`` of an evaluation split (``val``, ``test``, or the named
``data.eval_split``) are that split's; the training split's are the others in its folder. Every problem is one
:class:`DataError` naming the CSV (and the row) and the fix: a missing or unreadable file, a row that is not
``path,label``, a path that is not an image of the folder, an image given two labels, fewer than two classes.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from selfsup.data.formats.folder import FolderSource, all_images
from selfsup.data.imagedata import MAX_LISTED, DataError

__all__ = ["LabelTable", "labelled_source", "read_label_csv"]

ROW_EXAMPLE = "photos/cat_01.jpg,cat"


@dataclass(frozen=True)
class LabelTable:
    """The rows of a label CSV: image paths relative to ``root`` (normalised, in the CSV's order) -> class name."""

    csv: Path
    root: Path
    labels: dict[str, str]
    lines: dict[str, int]  # the CSV line of each path, for messages
    classes: list[str]  # the class names, sorted: label i is classes[i]

    def under(self, folder: Path) -> list[str]:
        """The labelled paths inside ``folder`` (a folder under ``root``, or ``root`` itself)."""
        prefix = _relative(folder, self.root)
        return [p for p in self.labels if _inside(p, prefix)]


def _relative(path: str | Path, root: Path) -> str:
    """``path`` relative to ``root`` and normalised ("." for root itself; starts with ".." when outside it)."""
    return os.path.relpath(os.path.abspath(path), os.path.abspath(root))


def _inside(path: str, folder: str) -> bool:
    return folder == "." or path.startswith(folder + os.sep)


def _rows(path: Path) -> list[tuple[int, list[str]]]:
    """The CSV's non-blank rows with their line numbers; a missing or unreadable file is a DataError."""
    if not path.exists():
        raise DataError(f"data.labels: {path} does not exist; give the CSV of path,label rows (e.g. "
                        f"{ROW_EXAMPLE}), its path relative to the working directory or absolute")
    if not path.is_file():
        raise DataError(f"data.labels: {path} is not a file; give the CSV of path,label rows (e.g. {ROW_EXAMPLE})")
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            return [(reader.line_num, row) for row in reader if any(cell.strip() for cell in row)]
    except UnicodeDecodeError as err:
        raise DataError(f"data.labels: {path} is not UTF-8 text (byte {err.start}); save it as a UTF-8 CSV of "
                        f"path,label rows") from err
    except csv.Error as err:
        raise DataError(f"data.labels: {path} is not a readable CSV ({err}); save it as a CSV of path,label "
                        f"rows") from err
    except OSError as err:
        raise DataError(f"data.labels: {path} cannot be read ({err.strerror}); check its permissions") from err


def read_label_csv(path: str | Path, root: str | Path) -> LabelTable:
    """Parse and check a label CSV against ``root`` (paths only: whether they are images is
    :func:`labelled_source`'s check, which lists the folder)."""
    path, root = Path(path).expanduser(), Path(root).expanduser()
    rows = _rows(path)
    if rows and len(rows[0][1]) == 2 and not os.path.splitext(rows[0][1][0].strip())[1]:
        rows = rows[1:]  # a header: its "path" is no file name
    labels: dict[str, str] = {}
    lines: dict[str, int] = {}
    for line, row in rows:
        cells = [cell.strip() for cell in row]
        if len(cells) != 2 or not all(cells):
            raise DataError(f"data.labels: {path} line {line}: {','.join(row)!r} is not a path,label row; give "
                            f"each labelled image as its path (relative to data.root) and its class, e.g. "
                            f"{ROW_EXAMPLE}")
        name = _relative(cells[0] if os.path.isabs(cells[0]) else root / cells[0], root)
        if name in labels and labels[name] != cells[1]:
            raise DataError(f"data.labels: {path} lines {lines[name]} and {line} give {cells[0]} two labels "
                            f"({labels[name]}, {cells[1]}); keep one row per image")
        labels.setdefault(name, cells[1])
        lines.setdefault(name, line)
    classes = sorted(set(labels.values()))
    if len(classes) < 2:
        raise DataError(f"data.labels: {path} labels {len(labels)} images of {len(classes)} class"
                        f"{'' if len(classes) == 1 else 'es'} ({', '.join(classes) or 'none'}); evaluation needs "
                        f"at least 2 classes: label images of another class too")
    return LabelTable(path, root, labels, lines, classes)


def check_images(table: LabelTable) -> None:
    """Every labelled path is an image of the folder (as its listing reads it); else a DataError naming the first
    few. Lists the whole folder once (no image is opened)."""
    listing = all_images(table.root)
    images = {listing.name(i) for i in range(len(listing))}
    missing = [p for p in table.labels if p not in images]
    if missing:
        named = ", ".join(f"{p} (line {table.lines[p]})" for p in missing[:MAX_LISTED])
        more = f" and {len(missing) - MAX_LISTED} more" if len(missing) > MAX_LISTED else ""
        raise DataError(f"data.labels: {table.csv} names {len(missing)} path(s) that are not images of "
                        f"{table.root}: {named}{more}; paths are relative to data.root ({table.root}), not to the "
                        f"working directory, or absolute inside it; fix them, or point data.root at the folder "
                        f"that holds these images")


def labelled_source(table: LabelTable, split: str, folder: Path, eval_splits: Sequence[str] = ()) -> FolderSource:
    """The labelled images of one split, sorted by path, labelled with the CSV's classes.

    ``folder``: the split's folder. ``eval_splits``: the splits evaluation may test on (``val``, ``test``, ...).
    One of them (``split`` in ``eval_splits``) takes the labelled images in its folder; any other split (the
    training split) takes those in its folder except the ones in an evaluation split's folder (``root/<name>``),
    and a labelled image in none of these folders is an error (it would be read by nothing).
    """
    check_images(table)
    held_out = [table.root / name for name in eval_splits if name != split and (table.root / name).is_dir()]
    chosen = set(table.under(folder))
    for other in held_out:
        chosen -= set(table.under(other))
    if split not in eval_splits:
        placed = set(table.under(folder)).union(*(table.under(other) for other in held_out))
        stray = [p for p in table.labels if p not in placed]
        if stray:
            raise DataError(f"data.labels: {table.csv} labels {len(stray)} image(s) outside the {split} split's "
                            f"folder {folder} and the evaluation splits' folders: {', '.join(stray[:MAX_LISTED])}; "
                            f"move them into {folder}, or remove their rows")
    if not chosen:
        hint = ("label some of its images" if split not in eval_splits else
                "label some of its images, or set data.eval_split=auto (a stratified hold-out of the labelled "
                "training images)")
        raise DataError(f"data.labels: {table.csv} labels none of the images of the {split} split ({folder}); "
                        f"{hint}")
    index = {name: i for i, name in enumerate(table.classes)}
    names = sorted(chosen)
    return FolderSource(table.root, [os.path.join(str(table.root), n) for n in names],
                        [index[table.labels[n]] for n in names], list(table.classes))
