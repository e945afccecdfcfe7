"""Where a real FlashInfer's source comes from: a release number, a wheel or a directory.

Nothing here imports the real package (it needs CUDA): files are read as text, from the
wheel's zip or from disk. A release number is fetched once with ``pip download --no-deps``
into ``$A2A_TESTBED_CACHE`` (default ``~/.cache/a2a-testbed``) and read from there after.
"""

from __future__ import annotations

import compileall
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

PACKAGE = "flashinfer-python"


class SourceError(Exception):
    """The FlashInfer source cannot be obtained or is not a FlashInfer."""


@dataclass(frozen=True)
class Source:
    """Read-only access to one FlashInfer release's files, by path under ``flashinfer/``."""

    version: str
    origin: str
    _zip: Optional[zipfile.ZipFile] = None
    _root: Optional[Path] = None
    read_paths: dict = field(default_factory=dict)  # rel path -> text, of every file read

    def read(self, rel: str) -> Optional[str]:
        """Text of ``flashinfer/<rel>``, or None when the release has no such file."""
        if self._zip is not None:
            try:
                text = self._zip.read(f"flashinfer/{rel}").decode()
            except KeyError:
                return None
        else:
            path = self._root / rel
            if not path.is_file():
                return None
            text = path.read_text()
        self.read_paths[rel] = text
        return text

    def find(self, basename: str) -> Optional[str]:
        """Text of the one file named ``basename`` anywhere under ``flashinfer/data/csrc``
        (releases move the C++ sources between folders), or None."""
        if self._zip is not None:
            names = sorted(n[len("flashinfer/"):] for n in self._zip.namelist()
                           if n.startswith("flashinfer/data/csrc/") and n.rsplit("/", 1)[-1] == basename)
        else:
            names = sorted(str(p.relative_to(self._root)) for p in (self._root / "data" / "csrc").rglob(basename))
        return self.read(names[0]) if names else None


def open_source(spec: str) -> Source:
    """A FlashInfer release's source from ``spec``.

    Parameters
    ----------
    spec : str
        A release number (``0.7.2.post1``; downloaded once and cached), a ``.whl`` file, or a
        directory: an unpacked wheel, a ``site-packages``, or the ``flashinfer`` package itself.

    Returns
    -------
    Source

    Raises
    ------
    SourceError
        The wheel cannot be downloaded, or the path holds no ``flashinfer`` package.
    """
    path = Path(spec)
    if path.is_dir():
        root = path if (path / "__init__.py").is_file() and path.name == "flashinfer" else path / "flashinfer"
        if not (root / "__init__.py").is_file():
            raise SourceError(f"--flashinfer {spec}: no flashinfer/__init__.py under this directory")
        return Source(_dir_version(root), str(root), _root=root)
    if spec.endswith(".whl"):
        if not path.is_file():
            raise SourceError(f"--flashinfer {spec}: no such wheel")
        return _wheel(path)
    if not re.fullmatch(r"\d+\.\d+\.\d+(\.post\d+|rc\d+)?", spec):
        raise SourceError(f"--flashinfer {spec!r}: expected a release number, a .whl file or a directory")
    return _wheel(_download(spec))


def _wheel(path: Path) -> Source:
    zf = zipfile.ZipFile(path)
    match = re.match(r"flashinfer_python-([^-]+)-", path.name)
    if match is None or "flashinfer/__init__.py" not in zf.namelist():
        raise SourceError(f"{path}: not a flashinfer-python wheel")
    return Source(match.group(1), str(path), _zip=zf)


def _cache() -> Path:
    return Path(os.environ.get("A2A_TESTBED_CACHE", Path.home() / ".cache" / "a2a-testbed"))


RELEASE = re.compile(r"\d+(\.\d+)*(\.post\d+|rc\d+)?")  # a release number, as pip prints it


def unpacked(dist: str, version: str) -> Path:
    """Release ``version`` of ``dist`` unpacked from its wheel (downloaded once and unpacked
    once, both cached): its Python, data and ``.dist-info``, without compiled extensions (the
    testbed imports an engine's Python on CPU, never its kernels). What an engine's
    ``--<engine>-source`` takes for a release number."""
    def fill(partial: Path, root: Path) -> None:
        with zipfile.ZipFile(_download(version, dist)) as zf:
            for name in zf.namelist():
                if not re.search(r"\.so(\.[\d.]+)?$|\.pyd$", name):
                    zf.extract(name, partial)
        # Its bytecode now, in parallel: where PYTHONDONTWRITEBYTECODE is set, every process that
        # imports the release would otherwise compile it from source again.
        compileall.compile_dir(str(partial), ddir=str(root), quiet=2, workers=0)

    return _made_once("unpacked", dist, version, fill)


def _made_once(kind: str, dist: str, version: str, fill) -> Path:
    """``<cache>/<kind>/<dist>-<version>``, made once: ``fill(partial, root)`` writes it into a
    fresh directory ``partial`` beside ``root`` (raising leaves nothing behind), which is then renamed into place, so
    processes making it at once never see half of it and the first one's copy stays."""
    stem = dist.replace("-", "_")
    root = _cache() / kind / f"{stem}-{version}"
    if (root / ".complete").is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{stem}-{version}-"))
    try:
        fill(partial, root)
    except BaseException:
        shutil.rmtree(partial)
        raise
    (partial / ".complete").touch()
    try:
        partial.rename(root)  # atomic: a process that made it first keeps its copy
    except OSError:
        shutil.rmtree(partial)
    return root


def _download(version: str, dist: str = PACKAGE) -> Path:
    """The wheel of ``dist==version``, from the cache or ``pip download --no-deps`` into it."""
    cache = _cache() / "wheels"
    stem = dist.replace("-", "_")
    hits = sorted(cache.glob(f"{stem}-{version}-*.whl"))
    if hits:
        return hits[0]
    cache.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(cache),
         f"{dist}=={version}"],
        capture_output=True, text=True, timeout=900,
    )
    hits = sorted(cache.glob(f"{stem}-{version}-*.whl"))
    if proc.returncode != 0 or not hits:
        raise SourceError(f"pip download {dist}=={version} failed: {proc.stderr.strip()[-800:]}")
    return hits[0]


# An engine's own tests, the pytest settings beside them, and the requirement files a checkout has.
SDIST_MEMBERS = ("tests/", "pyproject.toml", "requirements/")


def release_tests(dist: str, version: str) -> Path:
    """The ``tests/`` of release ``version`` of ``dist`` with its ``pyproject.toml`` (pytest's
    settings) and ``requirements/``, from the release's source distribution on the package index (downloaded once,
    checked against the index's sha256, unpacked once; both cached). Its wheel has no tests:
    an engine's own tests of a release come from here, never from a copy in the testbed.

    Raises
    ------
    SourceError
        The index has no source distribution of that release, or it could not be fetched.
    """
    def fill(partial: Path, root: Path) -> None:
        sdist = _download_sdist(dist, version)
        with tarfile.open(sdist) as tf:
            for member in tf.getmembers():
                if member.isfile() and "/" in member.name and member.name.split("/", 1)[1].startswith(SDIST_MEMBERS):
                    member.name = member.name.split("/", 1)[1]
                    tf.extract(member, partial, filter="data")
        if not (partial / "tests").is_dir():
            raise SourceError(f"{sdist.name} holds no tests/: {dist} {version}'s own tests are not in its source "
                              "distribution")

    return _made_once("tests", dist, version, fill)


def _download_sdist(dist: str, version: str) -> Path:
    """The source distribution ``dist-version.tar.gz``, from the cache or the package index
    (``PIP_INDEX_URL``, else PyPI), its sha256 checked. ``pip download`` cannot fetch it
    without building the package's metadata, which an engine's build cannot do on a CPU."""
    cache = _cache() / "sdists"
    name = f"{dist.replace('-', '_')}-{version}.tar.gz"
    names = {name, f"{dist}-{version}.tar.gz"}
    for hit in names:
        if (cache / hit).is_file():
            return cache / hit
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    try:
        with urllib.request.urlopen(f"{index}/{dist}/", timeout=120) as page:
            html = page.read().decode()
        link = next((m for m in re.finditer(r'href="([^"#]+/([^/"#]+))#sha256=([0-9a-f]{64})"', html)
                     if m.group(2) in names), None)
        if link is None:
            raise SourceError(f"{index}/{dist}/ lists no source distribution of {dist} {version}")
        with urllib.request.urlopen(urllib.parse.urljoin(f"{index}/{dist}/", link.group(1)), timeout=900) as got:
            data = got.read()
    except OSError as e:
        raise SourceError(f"fetching {dist} {version}'s source distribution from {index}: {e}") from None
    if hashlib.sha256(data).hexdigest() != link.group(3):
        raise SourceError(f"{link.group(2)}: sha256 differs from the index's")
    cache.mkdir(parents=True, exist_ok=True)
    partial = cache / f".{link.group(2)}.{os.getpid()}"
    partial.write_bytes(data)
    partial.rename(cache / link.group(2))
    return cache / link.group(2)


@dataclass(frozen=True)
class PackageSource:
    """Read-only access to a released Python package's files (a consumer such as vLLM), by
    path from the top of its wheel (``vllm/utils/flashinfer.py``)."""

    name: str  # the distribution
    version: str
    origin: str
    _zip: Optional[zipfile.ZipFile] = None
    _root: Optional[Path] = None

    def files(self) -> list[str]:
        package = self.name.replace("-", "_")
        if self._zip is not None:
            return [n for n in self._zip.namelist() if n.startswith(package + "/") and n.endswith(".py")]
        return [str(p.relative_to(self._root)) for p in (self._root / package).rglob("*.py")]

    def read(self, rel: str) -> str:
        if self._zip is not None:
            return self._zip.read(rel).decode()
        return (self._root / rel).read_text()

    def requires(self) -> list[str]:
        """The ``Requires-Dist`` lines of its metadata; for a checkout, which has none, the
        requirements its own files list (:func:`checkout_requirements`)."""
        if self.checkout:
            return checkout_requirements(self._root)
        return [line.split(":", 1)[1].strip() for line in self._metadata().splitlines()
                if line.startswith("Requires-Dist:")]

    @property
    def checkout(self) -> bool:
        """Whether this is a checkout (a directory without the ``.dist-info`` an install or a
        wheel has): its version and requirements come from its own files."""
        return self.version.startswith(CHECKOUT)

    def _metadata(self) -> str:
        stem = self.name.replace("-", "_")
        if self._zip is not None:
            names = [n for n in self._zip.namelist() if n.endswith(".dist-info/METADATA")]
            return self._zip.read(names[0]).decode() if names else ""
        hits = sorted(self._root.glob(f"{stem}-*.dist-info/METADATA"))
        return hits[0].read_text() if hits else ""


def open_package(dist: str, spec: Optional[str]) -> PackageSource:
    """A package's source: installed (``spec`` None; found through its metadata, not imported),
    a release number (downloaded once, cached), a ``.whl`` or a directory holding the package
    and its ``.dist-info``."""
    stem = dist.replace("-", "_")
    if spec is None:
        import importlib.metadata

        try:
            found = importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            raise SourceError(f"{dist} is not installed here: give {dist}=VERSION, a wheel or a directory") from None
        return PackageSource(dist, found.version, "installed", _root=Path(found.locate_file("")))
    path = Path(spec)
    if path.is_dir():
        root = package_root(stem, path)
        if root is None:
            raise SourceError(f"{dist}={spec}: no {stem}/ package under this directory (nor under its python/)")
        hits = sorted(root.glob(f"{stem}-*.dist-info"))
        version = hits[0].name[len(stem) + 1:-len(".dist-info")] if hits else CHECKOUT + checkout_version(root, stem)
        return PackageSource(dist, version, str(root), _root=root)
    if spec.endswith(".whl"):
        if not path.is_file():
            raise SourceError(f"{dist}={spec}: no such wheel")
    elif RELEASE.fullmatch(spec):
        path = _download(spec, dist)
    else:
        raise SourceError(f"{dist}={spec!r}: expected a release number, a .whl file or a directory")
    match = re.match(rf"{stem}-([^-]+)-", path.name)
    if match is None:
        raise SourceError(f"{path}: not a {dist} wheel")
    return PackageSource(dist, match.group(1), str(path), _zip=zipfile.ZipFile(path))


CHECKOUT = "checkout "  # what a checkout's version starts with: ``checkout 0.34.0+g1234abc``


def package_root(stem: str, path: Path) -> Optional[Path]:
    """The directory that holds package ``stem`` (what goes on ``sys.path``) in ``path``: the
    package directory's parent, an unpacked wheel or a checkout's root (vLLM's, with ``vllm/``
    at its top), or a checkout's ``python/`` (SGLang's); None where there is none."""
    if path.name == stem and (path / "__init__.py").is_file():
        return path.parent
    for root in (path, path / "python"):
        if (root / stem).is_dir():
            return root
    return None


@functools.lru_cache(maxsize=None)  # an engine's release is read many times a run; git is asked once
def checkout_version(root: Path, stem: str) -> str:
    """What a checkout says of its version: ``git describe`` where it is a git work tree (a
    tag ``v0.34.0`` as ``0.34.0``, a commit after it as ``0.34.0+g1234abc``), else the version
    file a build would have left (``<stem>/_version.py``, setuptools-scm's), else ``(version
    unknown)``."""
    try:
        done = subprocess.run(["git", "-C", str(root), "describe", "--tags", "--long", "--always"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        done = None
    if done is not None and done.returncode == 0 and done.stdout.strip():
        m = re.fullmatch(r"v?(.+)-(\d+)-g([0-9a-f]+)", done.stdout.strip())
        if m:
            return m.group(1) if m.group(2) == "0" else f"{m.group(1)}+g{m.group(3)}"
        return f"0+g{done.stdout.strip()}"  # no tag: the commit alone
    return _declared_version(root / stem / "_version.py") or "(version unknown)"


def checkout_requirements(root: Path) -> list[str]:
    """The requirements a checkout's own files list, as ``Requires-Dist`` would give them:
    ``requirements/*.txt`` (vLLM keeps its FlashInfer pin in ``requirements/cuda.txt``) and the
    ``pyproject.toml`` at the top or the one above (SGLang's ``python/pyproject.toml``)."""
    files = sorted(root.glob("requirements/*.txt")) + sorted(root.glob("requirements*.txt"))
    files += [p for p in (root / "pyproject.toml", root.parent / "pyproject.toml") if p.is_file()]
    found = []
    for f in files:
        for line in f.read_text(errors="replace").splitlines():
            line = line.split("#", 1)[0].strip().strip(",").strip().strip("\"'")
            if re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[^\]]*\])?\s*(==|>=|<=|~=|!=|<|>|;|$)", line):
                found.append(line)
    return found


def _dir_version(root: Path) -> str:
    dist = sorted(root.parent.glob("flashinfer_python-*.dist-info"))
    if dist:
        return dist[0].name[len("flashinfer_python-"):-len(".dist-info")]
    for rel in ("_build_meta.py", "version.py", "__init__.py"):
        found = _declared_version(root / rel)
        if found:
            return found
    return "unknown"


def _declared_version(f: Path) -> Optional[str]:
    """The string a file assigns to ``__version__`` (setuptools-scm writes ``__version__ =
    version = '...'``), or None."""
    if not f.is_file():
        return None
    m = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?[\"']([^\"']+)", f.read_text())
    return m.group(1) if m else None
