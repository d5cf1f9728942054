"""The work ``tools.worker`` runs in its child process: grep, outline, PDF text, image facts.

This file is the child's program, ``python ... parsers.py TASK MB CPU``, run sealed in
bubblewrap as ``/parse/parsers.py`` (see ``tools.worker``). It imports only the standard
library at start (pypdf and Pillow inside the tasks that use them, from beside it in
``/parse``), never the ``tools`` package, so a child starts in about a quarter of the time a
``tools`` import takes. It sets its own rlimits first (RLIMIT_AS, RLIMIT_CPU, RLIMIT_FSIZE 0,
RLIMIT_CORE 0, RLIMIT_NPROC 0: it starts no process or thread), then reads a JSON line of
arguments and the data from stdin, and writes one JSON object to stdout: ``{"value": ...}``,
``{"refused": message}`` (the input is at fault: the message is for the agent),
``{"memory": true}`` or ``{"bug": traceback}``.

Files come as descriptors the bot opened through the workspace jail and passed down, so
the child needs no paths; walks below them open with ``O_NOFOLLOW`` and never follow a link.
``tools.search`` also uses ``walk`` and ``read_small_text`` from here for glob and tree.
"""

from __future__ import annotations

import ast
import fnmatch
import io
import json
import os
import re
import resource
import stat
import sys
import traceback
from collections.abc import Callable, Iterator

MAX_MATCHES = 100
MAX_GREP_FILE_BYTES = 5 * 1024 * 1024
MATCH_PREVIEW_CHARS = 200
MAX_OUTLINE_LINES = 300
SKIPPED_DIRS = {".git", "__pycache__", ".venv", "node_modules", ".mypy_cache", ".pytest_cache"}
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # as tools.fsroot's
_MIB = 1 << 20


class Refused(ValueError):
    """The input cannot be handled; the message tells the agent why (a ToolError in the bot)."""


def is_binary(head: bytes) -> bool:
    return b"\0" in head  # the test tools.files uses, here without importing tools


def walk(dir_fd: int) -> Iterator[tuple[str, list[str], list[str], int]]:
    """``os.fwalk`` below an open folder: (relative folder, subfolders, other names, folder fd).

    Subfolders are sorted and pruned of SKIPPED_DIRS; links count as other names.
    """
    for folder, dirs, files, fd in os.fwalk(".", dir_fd=dir_fd, follow_symlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        yield folder.removeprefix("./").removeprefix("."), dirs, sorted(files), fd


def read_small_text(name: str, dir_fd: int) -> bytes | None:
    """A regular text file's bytes, or None for links, special, binary or too large files."""
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except OSError:  # ELOOP: a link; or gone meanwhile
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_GREP_FILE_BYTES:
            return None
        os.set_blocking(fd, True)
        data = f.read()
    return None if is_binary(data[:8192]) else data


# --- grep ---


def grep_task(args: dict, _: bytes) -> str:
    """Lines matching a Python regular expression below the inherited descriptor."""
    pattern, path, glob = args["pattern"], args["path"], args["glob"]
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise Refused(f"invalid regular expression {pattern!r}: {exc}") from None
    matches: list[str] = []
    searched = 0
    def wanted(name: str) -> bool:
        return fnmatch.fnmatch(name.rsplit("/", 1)[-1], glob) or fnmatch.fnmatch(name, glob)

    for name, data in _grep_targets(args["fd"], args["folder"], args["base"], wanted):
        searched += 1
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if regex.search(line):
                preview = line.strip()
                if len(preview) > MATCH_PREVIEW_CHARS:
                    preview = preview[:MATCH_PREVIEW_CHARS] + " [...]"
                matches.append(f"{name}:{number}: {preview}")
                if len(matches) >= MAX_MATCHES:
                    return "\n".join(matches) + (f"\n[stopped after {MAX_MATCHES} matches; narrow "
                                                 f"the pattern, path or glob]")
    if not matches:
        return f"no matches for {pattern!r} in {searched} text files under {path} (glob {glob!r})"
    return "\n".join(matches) + f"\n({len(matches)} matches in {searched} files searched)"


def _grep_targets(fd: int, folder: bool, base: str,
                  wanted: Callable[[str], bool]) -> Iterator[tuple[str, bytes]]:
    """(workspace-relative name, bytes) of each wanted text file at or below the open ``fd``;
    names are checked before their files are read."""
    if not folder:
        if not wanted(base):
            return
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_GREP_FILE_BYTES + 1)
        if len(data) <= MAX_GREP_FILE_BYTES and not is_binary(data[:8192]):
            yield base, data
        return
    for folder_name, _, files, dir_fd in walk(fd):
        for name in files:
            path = "/".join(p for p in (base, folder_name, name) if p and p != ".")
            if wanted(path):
                data = read_small_text(name, dir_fd)
                if data is not None:
                    yield path, data


# --- outline ---


def outline_task(args: dict, source: bytes) -> str:
    """The classes and functions of a Python source, with line ranges and signatures."""
    path = args["path"]
    try:
        module = ast.parse(source, filename=path)
    except SyntaxError as exc:
        where = f"line {exc.lineno}, column {exc.offset}" if exc.lineno else "an unknown line"
        text = f": {exc.text.strip()}" if exc.text else ""
        raise Refused(f"{path} has a syntax error at {where}: {exc.msg}{text}") from None
    except ValueError as exc:  # e.g. null bytes
        raise Refused(f"{path} cannot be parsed as Python: {exc}") from None
    lines = [f"{path} ({len(source.splitlines())} lines)"]
    _outline_body(module.body, 0, lines)
    if len(lines) == 1:
        lines.append("(no classes or functions)")
    if len(lines) > MAX_OUTLINE_LINES:
        lines = lines[:MAX_OUTLINE_LINES] + ["[... cut; grep for a name to find the rest]"]
    return "\n".join(lines)


def _outline_body(body: list[ast.stmt], level: int, lines: list[str]) -> None:
    for node in body:
        indent = "    " * level
        if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])  # decorators belong to it
        span = f"[{start}-{node.end_lineno}]"
        decorators = "".join(f"@{ast.unparse(d)} " for d in node.decorator_list)
        if isinstance(node, ast.ClassDef):
            bases = ", ".join(ast.unparse(b) for b in node.bases + node.keywords)
            lines.append(f"{indent}{decorators}class {node.name}{f'({bases})' if bases else ''}  {span}")
            _outline_body(node.body, level + 1, lines)
        else:
            prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
            returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
            signature = f"{node.name}({ast.unparse(node.args)}){returns}"
            lines.append(f"{indent}{decorators}{prefix} {signature}  {span}")


# --- PDF ---


def pdf_task(args: dict, _: bytes) -> str:
    """The text of the requested pages of the PDF at the inherited descriptor, with markers."""
    path, start_page, pages, max_chars = (args["path"], args["start_page"], args["pages"],
                                          args["max_chars"])
    with os.fdopen(args["fd"], "rb", closefd=False) as f:
        reader = _open_pdf(f.read(args["max_bytes"] + 1)[:args["max_bytes"]], path)
    total = len(reader.pages)
    if start_page > total:
        raise Refused(f"start_page {start_page} is past the end: {path} has {total} pages")
    out: list[str] = []
    used = 0
    last = start_page - 1
    for number in range(start_page, min(start_page + pages, total + 1)):
        text = _page_text(reader, number - 1)
        room = max_chars - used
        if out and len(text) > room:
            break  # the next call starts with this page
        if len(text) > room:
            text = f"{text[:room]}\n[... page cut, {len(text) - room} more characters]"
        out.append(f"--- page {number} ---\n{text}")
        used += len(text)
        last = number
    header = f"{path}: pages {start_page}-{last} of {total}"
    if last < total:
        footer = (f"({total - last} more pages; read on with read_pdf(path={path!r}, "
                  f"start_page={last + 1}))")
    else:
        footer = "(end of document)"
    return f"{header}\n" + "\n".join(out) + f"\n{footer}"


def _open_pdf(data: bytes, path: str):
    from pypdf import PdfReader
    from pypdf.errors import DependencyError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise Refused(f"{path} is encrypted with a password; it cannot be read here")
        # Counting pages parses the page tree, so a damaged file fails here, not mid-read.
        if len(reader.pages) == 0:
            raise Refused(f"{path} is a PDF without pages; there is nothing to read")
        return reader
    except (Refused, MemoryError):
        raise
    except DependencyError:
        raise Refused(f"{path} is encrypted (AES) and this bot lacks the library to "
                      "decrypt it; it cannot be read here") from None
    except Exception as exc:  # pypdf raises many kinds for damaged files; all mean the same
        raise Refused(f"{path} could not be read as a PDF: it is damaged or not a PDF "
                      f"({type(exc).__name__}: {exc})") from None


def _page_text(reader, index: int) -> str:
    try:
        text = (reader.pages[index].extract_text() or "").strip()
    except MemoryError:
        raise
    except Exception as exc:  # one bad page must not hide the others
        return f"(could not extract text from this page: {type(exc).__name__})"
    return text or "(no text on this page; it may be a scanned image or a drawing)"


# --- images ---


def image_task(args: dict, data: bytes) -> dict:
    """What view_image tells of an image: opened (decoded only where the format must) and
    verified; refused for non-images, images over ``max_pixels`` and damaged ones."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    path, limit = args["path"], args["max_pixels"]
    Image.MAX_IMAGE_PIXELS = limit  # Pillow warns above it and refuses at twice it...
    warnings.simplefilter("error", Image.DecompressionBombWarning)  # ...and now refuses above it
    try:
        image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise Refused(f"{path} is not an image this bot can read (PNG, JPEG, GIF, WebP, BMP, "
                      "TIFF, ...); read_file shows text files, file_info tells a file's type") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # Refused before any decoding; Pillow's message holds the size ("(N pixels)").
        size = re.search(r"\((\d+) pixels\)", str(exc))
        pixels = f"{int(size.group(1)):,} pixels" if size else f"over {limit:,} pixels"
        raise Refused(f"{path} is too large an image to open ({pixels}; the limit is "
                      f"{limit:,}). Scale it down first") from None
    except MemoryError:
        raise
    except Exception as exc:  # a plugin that reads at open time (ICO, ...) hit damage
        raise Refused(f"{path} could not be opened as an image ({exc})") from None
    width, height = image.size
    if width * height > limit:
        raise Refused(f"{path} is {width}x{height} = {width * height:,} pixels; the limit is "
                      f"{limit:,}. Scale it down first")
    try:
        Image.open(io.BytesIO(data)).verify()  # verify() spends its image; keep `image` usable
        frames = getattr(image, "n_frames", 1)
    except MemoryError:
        raise
    except Exception as exc:  # Pillow raises many kinds for damaged files
        raise Refused(f"{path} is a damaged {image.format} image ({exc})") from None
    return {"format": image.format, "width": width, "height": height, "mode": image.mode,
            "frames": frames, "mime": Image.MIME.get(image.format or "", "application/octet-stream")}


def probe_task(args: dict, data: bytes) -> dict:
    """What a task sees: environment names, ids, rlimits, working directory, descriptors,
    modules, the processes in its /proc, and for each path in ``args["read"]`` its first
    bytes or the error. For the tests and the probes: the paths stand in for what code an
    exploit ran in a parser would try to read. The bot never passes the agent's paths."""
    names = ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_CORE", "RLIMIT_NPROC")
    limits = {name: resource.getrlimit(getattr(resource, name))[0] for name in names}
    return {"env": sorted(os.environ), "uid": os.getuid(), "gid": os.getgid(), "limits": limits,
            "cwd": os.getcwd(), "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
            "bytes": len(data), "sys_path": sys.path, "tools_imported": "tools" in sys.modules,
            "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
            "read": {path: _first_bytes(path) for path in args.get("read", [])}}


def _first_bytes(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode("latin-1")
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror}"


TASKS = {"grep": grep_task, "outline": outline_task, "pdf": pdf_task, "image": image_task,
         "probe": probe_task, "probe_packages": probe_task}


# --- the child's program ---


def _limit(memory_mb: int, cpu_s: int) -> None:
    # RLIMIT_NPROC 0: no fork or thread (what code an exploit ran could use to outlive the
    # parse); it binds every uid but root, and the sandbox never runs this as root.
    for which, value in ((resource.RLIMIT_AS, memory_mb * _MIB), (resource.RLIMIT_CPU, cpu_s),
                         (resource.RLIMIT_FSIZE, 0), (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_NPROC, 0)):
        _, hard = resource.getrlimit(which)
        soft = value if hard == resource.RLIM_INFINITY else min(value, hard)
        # CPU: the soft limit sends SIGXCPU; the hard one, a second later, SIGKILL.
        extra = 1 if which == resource.RLIMIT_CPU and hard == resource.RLIM_INFINITY else 0
        resource.setrlimit(which, (soft, soft + extra))


def _reply(payload: dict) -> None:
    sys.stdout.write(json.dumps(payload))
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    task, memory_mb, cpu_s = TASKS[argv[0]], int(argv[1]), int(argv[2])
    _limit(memory_mb, cpu_s)
    args = json.loads(sys.stdin.buffer.readline())
    data = sys.stdin.buffer.read()
    try:
        value = task(args, data)
    except MemoryError:
        data = args = None  # give back what we can, to be able to answer at all
        _reply({"memory": True})
    except ValueError as exc:  # Refused, and the parsers' own refusals
        _reply({"refused": str(exc)})
    except OSError as exc:  # reading through an inherited descriptor: no host paths in it
        _reply({"refused": f"reading failed: {exc.strerror or exc}"})
    except RecursionError:
        _reply({"refused": "the input is nested too deeply to parse"})
    except Exception as exc:
        _reply({"bug": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"})
    else:
        _reply({"value": value})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
