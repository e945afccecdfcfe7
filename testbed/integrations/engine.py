"""What every engine adapter (``vllm``, ``sglang``) does the same way: probe the classes it
drives, make the rank pools import the engine, take a checkout's Python.

An engine is described by :class:`Engine`: its package, the flag and environment variable that
point at a checkout, the releases the adapter is written for, the ``(module, name)`` pairs it
reaches for, and what must hold before it is imported. Each is imported under the fake as the
FlashInfer release the engine's metadata pins, so the names it binds from FlashInfer at import exist.
An adapter module exposes its engine's :meth:`Engine.unavailable`, :meth:`Engine.use` and
:meth:`Engine.preload` as its own.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.util
import inspect
import os
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import torch

from testbed import patch
from testbed.scenario.events import Collective

if TYPE_CHECKING:
    from testbed.contract.consumer import Consumer


# Where the testbed serves an engine (``a2a-testbed serve``), the run's directory, in the
# environment of every process the server starts: its plan, and each rank's logs. The engine's
# serving plugin acts only where it is set.
SERVE_RUN_ENV = "A2A_SERVE_RUN"


def _no_variables(es, reference: bool) -> dict:
    return {}


@dataclass(frozen=True)
class Serving:
    """How a user serves an engine, and what its processes need on this host.

    ``command``: ``(EngineScenario, checkpoint directory, port, reference) -> argv`` of its own
    server on the loopback address with the deployment's data and expert parallel
    (``reference``: DP 1, expert parallel off); ``environment``: ``(EngineScenario, reference)
    -> the variables`` such a deployment sets; ``devices``: whether its processes get the
    stand-in accelerators (:mod:`fakes.accelerator`; else the engine's own CPU device);
    ``prompt_logprobs``: how its OpenAI API returns a prompt's logprobs (``"prompt_logprobs"``,
    vLLM's request field, or ``"echo"``, the prompt echoed with its logprobs); ``prepare``: the
    function ``module:name`` each of its processes calls before its main module
    (:data:`fakes.spawned.PREPARE_ENV`), or none; ``ready``: the paths, the first its release
    has (a 404 moves on), that answer 200 once its server takes requests, without generating
    (SGLang's ``/health`` generates a token once the server is up); ``plugins``: the module
    that loads the engine's plugins in each of its processes, through which the testbed's
    serving plugin goes in (a release without it cannot be served); ``shapes``: its serve matrix, each
    ``(all-to-all path, DP, TP, concurrent requests)`` (fewer requests than DP ranks leave one
    idle), whose paths are the ones it serves; ``offline``: ``(EngineScenario, checkpoint
    directory, run directory) -> argv`` of the engine's offline data parallel as its
    documentation shows it, each DP rank's process writing its answers to the run directory
    (:mod:`testbed.integrations.served`, :func:`write_answers`), or None; ``offline_shapes``:
    the matrix's entries run that way; ``refusal``: the function ``module:name`` (named, not
    imported: the engine's rules import this description), ``(EngineScenario) -> why`` the
    release cannot serve the deployment (its own start-up refuses it, or its platform cannot
    run it; asked in the testbed's process, the release in use) or None; or no such function."""

    command: Callable
    environment: Callable = _no_variables
    devices: bool = True
    prompt_logprobs: str = "prompt_logprobs"
    prepare: str = ""
    ready: tuple[str, ...] = ("/health",)
    plugins: str = ""
    shapes: tuple[tuple[str, int, int, int], ...] = (("one_sided", 2, 1, 3), ("two_sided", 2, 1, 3),
                                                     ("one_sided", 4, 1, 2), ("two_sided", 4, 1, 2),
                                                     ("one_sided", 2, 2, 3))
    offline: Optional[Callable] = None
    refusal: str = ""
    offline_shapes: tuple[tuple[str, int, int, int], ...] = ()

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(path for path, *_ in self.shapes))


@dataclass(frozen=True)
class Engine:
    name: str  # the package and the --integration value
    label: str  # as the engine spells itself
    source_env: str
    source_hint: str  # where in a checkout its package lies
    tested: tuple[str, ...]
    capabilities: tuple[tuple[str, str], ...]
    prepare_environment: Callable[[], None]  # what must hold before the engine is imported
    preload_extra: tuple[str, ...] = ()  # modules beyond the capabilities' that ranks should fork with
    default_pin: str = "0.7.2"  # what the sweeps name a pin of a release that has none
    # Other releases the adapter drives, each from its wheel (``--<name>-source RELEASE``).
    other_releases: tuple[str, ...] = ()
    consumer: "Consumer | None" = None  # its FlashInfer all-to-all path's files (the consumer contract's)
    # Every release since the engine's FlashInfer all-to-all appeared, oldest first: what
    # ``a2a-testbed history`` runs or refuses.
    history: tuple[str, ...] = ()
    # Capability probes that a name alone cannot say: each, called with the release imported
    # under the fake as its pin, returns what the release lacks ("has no ...") or None.
    probes: tuple[Callable[[], str | None], ...] = ()
    # Modules a rank imports on first use in a scenario (the engine's lazy imports, the
    # adapter's own): imported in the fork server too, else every new rank process imports
    # them again (py-spy of a release's runs: a third of the ranks' CPU time).
    rank_imports: tuple[str, ...] = ()
    # The packages outside the engine its import spends most of its time in: imported before
    # the engine, so that the fork server forks from them instead of importing them again
    # (:mod:`testbed.cluster.zygote`); each one the engine imports anyway.
    dependencies: tuple[str, ...] = ()
    # The engine repository's own tests of its FlashInfer all-to-all, by path from the repository's
    # root (``a2a-testbed engine-tests`` runs them on the fake, with stand-in accelerators).
    own_tests: tuple[str, ...] = ()
    # Those of its tests the CPU stand-in cannot run, each ``(pytest node id, what it needs)``:
    # deselected by ``engine-tests`` and listed as not run, never reported as the engine's failure.
    own_tests_off_cpu: tuple[tuple[str, str], ...] = ()
    # How a user serves the engine (``a2a-testbed serve``); None where the testbed does not.
    serving: "Serving | None" = None

    @property
    def preload_module(self) -> str:
        """What a rank pool's fork server imports to have the engine loaded (:meth:`preload`)."""
        return f"testbed.integrations.{self.name}.preload"

    def package(self, source: str | None = None):
        """The files (read as text, never imported) of ``source`` (a release number, wheel or
        directory) or else of the copy in use: the checkout or unpacked wheel in
        ``source_env``, else the installed one.

        Raises
        ------
        SourceError
            No such copy (the engine not installed, a release not on the registry).
        """
        from testbed.contract.source import open_package

        return open_package(self.name, source or os.environ.get(self.source_env) or None)

    def release(self, source: str | None = None) -> tuple[str, str | None]:
        """``(version, FlashInfer pin)`` of :meth:`package`, read from its metadata, or for a
        checkout from its own files (``checkout 0.34.0+g1234abc``; a checkout whose files pin
        none: the release ``A2A_CHECKOUT_PIN`` names, the run's ``--profile``); ``unknown``,
        None without any."""
        from testbed.contract.consumer import pinned_flashinfer
        from testbed.contract.source import SourceError

        try:
            package = self.package(source)
        except SourceError:
            return "unknown", None
        pin = pinned_flashinfer(package)
        if pin is None and package.checkout:
            pin = os.environ.get(CHECKOUT_PIN_ENV) or None
        return package.version, pin

    def version_in_use(self) -> str:
        """The release in use (:meth:`release`), or where there is none the one the adapter is
        written for."""
        version = self.release()[0]
        return self.tested[0] if version == "unknown" else version

    def pinned(self, source: str | None = None) -> str:
        """The FlashInfer release this engine (or its release or checkout ``source``) runs on:
        the one its metadata pins, as pip prints it (a checkout's: the one its requirement
        files pin, else ``--profile``'s).

        A pin PyPI has no wheel of is served by evidence
        (:func:`testbed.contract.serving.evidence`): the profile under which every use this
        release's all-to-all path makes of FlashInfer is there, registered for this process
        and the ranks it starts.

        Raises
        ------
        UnservedRelease
            No profile serves the pin: one line naming the engine release, its pin and what
            the fake serves (for a wheelless pin: the use no profile has).
        """
        from fakes.flashinfer.profiles import WHEELLESS, UnservedRelease, resolve, serve_by_evidence, unserved_pin
        from testbed.contract.source import CHECKOUT

        version, pin = self.release(source)
        if pin is None and version.startswith(CHECKOUT):  # imitating a default would judge other code
            raise UnservedRelease(
                f"{self.label} {version} ({self.package(source).origin}) pins no FlashInfer in its requirements/*.txt "
                f"or pyproject.toml: name the release it runs on with --profile RELEASE")
        try:
            resolve(pin or self.default_pin)
        except UnservedRelease:
            if pin not in WHEELLESS:
                raise unserved_pin(f"{self.label} {version}", pin) from None
            from testbed.contract.serving import evidence

            serve_by_evidence(evidence(f"{self.label} {version}", self.package(source), self.consumer, pin))
        return pin or self.default_pin

    def module(self, name: str):
        """Engine module ``name`` for a capability probe: the one this process has (a rank's
        fork server imported it, and a rank runs under ``install``), else imported under the
        fake as the engine's pin; None where the engine cannot run here."""
        found = sys.modules.get(name)
        if found is not None:
            return found
        if self.unavailable() is not None:
            return None
        import fakes.flashinfer

        with fakes.flashinfer.install(self.pinned()):
            return importlib.import_module(name)

    def unavailable(self) -> str | None:
        """Why ``--integration NAME`` cannot run here (one line), or None: the engine missing,
        pinning a FlashInfer no profile serves, or without a class the adapter drives (a
        capability probe, not a version compare)."""
        from fakes.flashinfer.profiles import UnservedRelease

        self.prepare_environment()
        if importlib.util.find_spec(self.name) is None:
            return (f"{self.label} is not installed: `./dev setup --{self.name}` installs {self.label} "
                    f"{', '.join(self.tested)} without its CUDA torch (or set {self.source_env} to a checkout)")
        try:
            pin = self.pinned()
        except UnservedRelease as e:
            return str(e)
        import fakes.flashinfer

        with fakes.flashinfer.install(pin):
            for module, name in self.capabilities:
                try:
                    lacks = self._lacks(module, name)
                except Exception as e:  # noqa: BLE001 - whatever breaks the import is the answer
                    return f"{self.label}'s {module} does not import: {type(e).__name__}: {e}"
                if lacks:
                    return f"{lacks}, which the adapter drives (it is written for {self.label} {', '.join(self.tested)})"
            for probe in self.probes:
                lacks = probe()
                if lacks:
                    return (f"{self.label} {self.release()[0]} {lacks}, which the adapter drives (it is written "
                            f"for {self.label} {', '.join(self.tested)})")
        return None

    def lacks(self, module: str, name: str) -> str | None:
        """``vLLM 0.28.0 has no module M`` / ``... has no M.N`` where the release in use has not
        ``module`` or its attribute ``name`` (dotted: ``FusedMoE._dispatch_with_pre_quant``),
        imported under the fake as the engine's pin; None where it has both."""
        import fakes.flashinfer

        with fakes.flashinfer.install(self.pinned()):
            return self._lacks(module, name)

    def missing_code(self, code: tuple, source: str | None = None) -> str | None:
        """Why the release (``source``, else the installed one) does not hold ``code``, a
        finding's ``(file, regular expression)`` pairs (a file may be a tuple of the paths it
        moved between): the first file it lacks or pattern that no longer matches; None where
        every pattern matches, or no release is here to read."""
        from testbed.contract.source import SourceError

        try:
            package = self.package(source)
        except SourceError:  # no release here to read (the engine not installed): nothing shows it gone
            return None
        for where, pattern in code:
            paths = (where,) if isinstance(where, str) else where
            found = _first_file(package, paths)
            if found is None:
                return f"{self.label} {package.version} has no {' or '.join(paths)}"
            path, text = found
            if re.search(pattern, text) is None:
                return f"{path} of {self.label} {package.version} no longer matches /{pattern}/"
        return None

    @functools.cache  # noqa: B019 - a failed import is attempted again each time; one Engine per adapter
    def unimportable(self, module: str) -> str | None:
        """``SGLang 0.5.15's M imports P, which this host lacks`` where importing the release's
        ``module`` fails on a package outside the engine (a CUDA build), else None (the engine
        not here included)."""
        import fakes.flashinfer

        if self.unavailable() is not None:  # prepares the process for the engine's import, too
            return None
        with fakes.flashinfer.install(self.pinned()):
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as e:
                if e.name is not None and not e.name.startswith(self.name):
                    return f"{self.label} {self.release()[0]}'s {module} imports {e.name}, which this host lacks"
        return None

    def _lacks(self, module: str, name: str) -> str | None:
        try:
            found = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name is None or not module.startswith(e.name):
                raise
            return f"{self.label} {self.release()[0]} has no module {e.name}"
        for part in name.split("."):
            if not hasattr(found, part):
                return f"{self.label} {self.release()[0]} has no {module}.{name}"
            found = getattr(found, part)
        return None

    @functools.cache  # noqa: B019 - one Engine per adapter module, alive as long as the process
    def use(self, source: str | None = None) -> str | None:
        """Make this process's rank pools run the engine (a checkout's or an unpacked wheel's
        Python where ``source`` is given; a release number: that release's wheel, fetched and
        unpacked once) and import it in their fork server (so call it before the first pool
        starts, and before this process imports the engine: the fork server is forked from this
        process with the engine's :attr:`dependencies` imported, :mod:`testbed.cluster.zygote`);
        returns why it cannot (one line, naming the flag), or None."""
        from testbed.cluster.pool import PRELOAD_ENV, preloaded_modules
        from testbed.contract.source import RELEASE, SourceError, unpacked

        if source and RELEASE.fullmatch(source):  # a release: its wheel, unpacked once and cached
            try:
                source = str(unpacked(self.name, source))
            except SourceError as e:
                return f"--{self.name}-source {source}: {e}"
        if source:
            from pathlib import Path

            from testbed.contract.source import package_root

            root = package_root(self.name, Path(source).resolve())
            if root is None:
                return (f"--{self.name}-source: {source} holds no {self.name}/ package (give a checkout, whose "
                        f"{self.source_hint} holds {self.name}/, an unpacked wheel or the package directory)")
            os.environ[self.source_env] = str(root)
        self.prepare_environment()
        if importlib.util.find_spec(self.name) is not None:
            from testbed.cluster import zygote

            zygote.start(self.dependencies)  # before anything of the engine is imported here
        why = self.unavailable()
        if why is None:
            os.environ[PRELOAD_ENV] = ",".join(dict.fromkeys(preloaded_modules() + (self.preload_module,)))
        return why and f"--integration {self.name}: {why}"

    def releases(self) -> tuple[str, ...]:
        """Every release the sweeps run but the installed one: :attr:`other_releases` and
        :attr:`history`, oldest first."""
        from fakes.flashinfer.profiles import release_key

        installed = self.release()[0]
        return tuple(sorted({*self.other_releases, *self.history} - {installed}, key=release_key))

    def fetch_releases(self) -> None:
        """Download and unpack the releases the sweeps run (:meth:`releases`) into the testbed's
        cache, once (``./dev setup`` does it, so tests running in parallel find them there; any
        other is fetched when first asked for). Four at once: a wheel's download waits on the
        network while another's unpacking and compiling takes the cores."""
        from concurrent.futures import ThreadPoolExecutor

        from testbed.contract.source import unpacked

        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda release: unpacked(self.name, release), self.releases()))

    def preload(self) -> None:
        """Import the modules the adapter drives and those a rank imports on first use
        (:attr:`rank_imports`), once in the fork server, so every rank forks with them loaded
        (a rank a mutant killed is replaced by a fork that needs no import); nothing where the
        engine is not installed. A module a release lacks, or cannot import on a CPU host, is
        left to the rank, which names the failure where the scenario needs it."""
        self.prepare_environment()
        if importlib.util.find_spec(self.name) is None:
            return
        import fakes.flashinfer

        modules = [module for module, _ in self.capabilities] + list(self.preload_extra) + list(self.rank_imports)
        with fakes.flashinfer.install(self.pinned()):  # the modules an engine imports lazily stay unimported
            for module in dict.fromkeys(modules):
                try:
                    importlib.import_module(module)
                except ImportError:
                    continue


CHECKOUT_PIN_ENV = "A2A_CHECKOUT_PIN"  # the FlashInfer a checkout that pins none runs on (--profile)


def source_first(variable: str) -> str | None:
    """The engine source that ``variable`` names (a release's unpacked tree) is the one this
    process imports, and the one any Python process it starts imports: vLLM inspects a model's
    class in a subprocess of its own, which would otherwise run the installed release and hand
    its answer, in that release's form, to the release under test. Returns the source (None
    where the variable names none)."""
    source = os.environ.get(variable)
    if not source:
        return None
    if source not in sys.path:
        sys.path.insert(0, source)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if source not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([source] + [p for p in paths if p])
    return source


def guarded_flashinfer_imports(module) -> dict:
    """Re-run ``module``'s guarded top-level ``from flashinfer... import`` blocks under the
    FlashInfer now installed, as a fresh import of the module would: a ``try`` block binds its
    names, or on ``ImportError`` sets the flags its ``except`` assigns; an ``if probe():`` block
    binds its names where the probe now answers true (``patch.UNBOUND`` where it does not).
    Returns ``{name: value}`` to set on the module (empty where it has no such block). An engine binds these names when it is first
    imported, under whatever FlashInfer was installed then; a scenario's release (and the
    testbed's recording classes) reach it only through this."""
    path = inspect.getsourcefile(module)
    found: dict = {}
    for test, imports, flags in _guarded_blocks(path, os.stat(path).st_mtime_ns):
        if test is not None:
            if eval(test, vars(module)):
                found.update(_imported(imports))
            else:  # not bound, unless another block binds it
                found.update({a.asname or a.name: found.get(a.asname or a.name, patch.UNBOUND)
                              for n in imports for a in n.names})
            continue
        try:
            found.update(_imported(imports))
        except ImportError:
            found.update({flag: False for flag in flags})
        else:
            found.update({flag: True for flag in flags})
    return found


@functools.cache
def _guarded_blocks(path: str, mtime_ns: int) -> tuple:
    """The guarded top-level ``from flashinfer`` blocks of the module file at ``path``, each
    ``(its if-test compiled, or None for a try block; its imports; the flags its except
    assigns)``: parsed once per file and process (a rank runs many scenarios; parsing
    vLLM's 1,200-line module was a sixth of a scenario's time)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    blocks = []
    for node in tree.body:
        if not isinstance(node, (ast.Try, ast.If)):
            continue
        imports = [n for n in node.body if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("flashinfer")]
        if not imports:
            continue
        if isinstance(node, ast.If):
            blocks.append((compile(ast.Expression(node.test), path, "eval"), imports, ()))
            continue
        flags = [t.id for n in node.handlers for s in n.body if isinstance(s, ast.Assign) for t in s.targets
                 if isinstance(t, ast.Name)]
        blocks.append((None, imports, flags))
    return tuple(blocks)


def _imported(imports: list) -> dict:
    found = {}
    for n in imports:
        source = importlib.import_module(n.module)
        for alias in n.names:
            try:
                found[alias.asname or alias.name] = getattr(source, alias.name)
            except AttributeError:
                raise ImportError(f"cannot import name {alias.name!r} from {n.module!r}") from None
    return found


def name_the_fake(ctx, sc) -> None:
    """On the fake, the engine's ``import flashinfer`` gets the fake as the scenario's release
    until the scenario ends."""
    if sc.flashinfer_backend == "fake":
        import fakes.flashinfer

        named = contextlib.ExitStack()
        ctx.add_cleanup(named.close)
        named.enter_context(fakes.flashinfer.install(sc.profile))


def model_between_forwards(ctx, log) -> None:
    """The rest of the model between two forwards (attention's TP collectives) orders every
    EP rank's previous forward before this one; a barrier of the EP group stands in for it,
    logged as the collective it is."""
    log.write(Collective(op="barrier", group=tuple(ctx.group_ranks["ep"]), site="testbed: the model between two forwards"))
    torch.distributed.barrier(group=ctx.groups["ep"])


class TorchOnThisDevice:
    """``torch`` as an engine module sees it on a GPU box, answering the rank's CPU where the
    module names its GPU: a tensor created on ``device="cuda"`` and the accelerator's current
    device index. Any other name is torch's own."""

    accelerator = type("accelerator", (), {"current_device_index": staticmethod(lambda: torch.device("cpu"))})

    def __getattr__(self, name):
        found = getattr(torch, name)
        if name in ("empty", "zeros", "ones", "full", "tensor", "arange"):
            return _on_the_cpu(found)
        return found


def _on_the_cpu(factory):
    @functools.wraps(factory)
    def made(*args, **kwargs):
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        return factory(*args, **kwargs)

    return made


def _first_file(package, paths: tuple[str, ...]) -> tuple[str, str] | None:
    """``(path, text)`` of the first of ``paths`` the release has (a file it moved between
    releases), or None."""
    for path in paths:
        try:
            return path, package.read(path)
        except (KeyError, FileNotFoundError):
            continue
    return None
