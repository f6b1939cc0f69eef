"""Checkpoints from the Hugging Face hub: found in the local cache, or downloaded once, before any engine starts.

Engine workers run with ``HF_HUB_OFFLINE=1`` (:func:`specbench.engine.worker_environment`)
and load the snapshot folder this module resolves a hub id to, so vLLM never
touches the network and a machine without it fails in one line up front, not
after minutes of retries in every cell. :func:`fetch_all` is that up-front
step (the sweeper, a single run and ``python -m specbench.calibrate`` call
it): a checkpoint already complete in the cache is used as it is, without any
network; a missing one is downloaded once (weights, config and tokenizer
files only) after the disk is checked for room; one that can be neither is
refused in one line naming the model, the config key and the fix.

The user's own ``HF_HUB_OFFLINE=1`` means cache only, and ``HF_ENDPOINT`` (a
mirror) is used for the probe and the download; both, like ``HF_HOME`` and
``HF_HUB_CACHE``, are read when called. Nothing here imports vLLM.
"""

from __future__ import annotations

import json
import os
import re
from fnmatch import fnmatch
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Iterable, Mapping, Sequence

DEFAULT_ENDPOINT = "https://huggingface.co"
# One bounded request decides whether the hub can be reached: huggingface_hub's own
# file lookups retry an unreachable host with backoff, for minutes per call.
PROBE_TIMEOUT_S = 10.0
# Top-level files a checkpoint needs besides its weights: config, generation config, tokenizer, chat template.
AUXILIARY_PATTERNS = ("*.json", "*.model", "*.tiktoken", "*.txt", "*.jinja")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


class HubError(ValueError):
    """Checkpoints that can be neither found in the cache nor downloaded: one line each, with the fix."""


def is_hub_id(reference: str) -> bool:
    """True when ``reference`` names a hub repository (``org/name``) rather than a local folder.

    Anything starting with ``.``, ``/`` or ``~``, with more than one slash, or
    that exists on disk is a local path; ``embedded:`` and ``heads:`` are not
    hub ids either (no ``:`` is allowed).
    """
    return (bool(_HUB_ID.match(reference)) and not reference.startswith(".")
            and not os.path.exists(reference))


def cache_dir() -> Path:
    """The hub cache huggingface_hub uses: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``~/.cache/huggingface/hub`` (read now, not when huggingface_hub was imported)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expandvars(os.environ["HF_HUB_CACHE"])).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def offline() -> bool:
    """Whether the user forbade network access to the hub (``HF_HUB_OFFLINE`` set to a true value)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def endpoint() -> str:
    """The hub (or mirror, ``$HF_ENDPOINT``) that probes and downloads go to."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _repo_folder(repo_id: str) -> Path:
    return cache_dir() / ("models--" + repo_id.replace("/", "--"))


def cached_snapshot(repo_id: str, *, tokenizer: bool = False, revision: str | None = None) -> Path | None:
    """The cache's snapshot folder of ``repo_id`` if it holds a loadable checkpoint; no network.

    The snapshot ``refs/main`` points to, else the newest complete one (a
    cache copied without its refs). Complete means a ``config.json`` and the
    weights: every shard an index names, or else a ``*.safetensors`` or
    ``*.bin`` file (a tokenizer fetched alone does not make a checkpoint);
    with ``tokenizer``, for a checkpoint whose tokenizer vLLM loads, also
    its tokenizer's files (:func:`has_tokenizer`). ``revision``: a pinned
    commit; only that commit's snapshot will do.
    """
    folder = _repo_folder(repo_id)
    snapshots = folder / "snapshots"
    if not snapshots.is_dir():
        return None
    if revision is not None:
        return snapshots / revision if _complete(snapshots / revision, tokenizer) else None
    ref = folder / "refs" / "main"
    if ref.is_file():
        pinned = snapshots / ref.read_text().strip()
        if _complete(pinned, tokenizer):
            return pinned
    complete = [s for s in snapshots.iterdir() if _complete(s, tokenizer)]
    return max(complete, key=lambda s: s.stat().st_mtime) if complete else None


def is_commit(revision: str) -> bool:
    """Whether ``revision`` is a full commit hash (40 lowercase hex digits), as a pin must be."""
    return bool(_COMMIT.match(revision))


def snapshot_revision(folder: str | os.PathLike[str]) -> str | None:
    """The commit hash of a hub snapshot folder (``.../snapshots/<commit>``); None for any other folder."""
    path = Path(folder)
    return path.name if path.parent.name == "snapshots" and _COMMIT.match(path.name) else None


# A tokenizer's vocabulary, in each form transformers' AutoTokenizer reads: a fast tokenizer's
# tokenizer.json, a SentencePiece model, a BPE vocab.json with its merges, a WordPiece vocab.txt, tiktoken ranks.
TOKENIZER_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"), ("vocab.txt",),
                   ("*.tiktoken",))


def has_tokenizer(snapshot: Path) -> bool:
    """Whether a checkpoint folder holds a tokenizer vLLM can load: one of :data:`TOKENIZER_FILES`' forms."""
    return any(all(any(p.is_file() for p in snapshot.glob(name)) for name in form) for form in TOKENIZER_FILES)


def _complete(snapshot: Path, tokenizer: bool = False) -> bool:
    if not (snapshot / "config.json").is_file():
        return False
    if tokenizer and not has_tokenizer(snapshot):
        return False
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (snapshot / index).is_file():
            try:
                shards = set(json.loads((snapshot / index).read_text())["weight_map"].values())
            except (ValueError, KeyError, TypeError):
                return False
            return all((snapshot / shard).is_file() for shard in shards)
    # is_file follows the snapshot's symlinks: a blob that was removed does not count.
    return any(p.is_file() for pattern in ("*.safetensors", "*.bin") for p in snapshot.glob(pattern))


@dataclass(frozen=True)
class _Download:
    """A checkpoint to download: its files, their bytes still missing, and the key that names it."""

    repo_id: str
    key: str
    files: tuple[str, ...]
    missing_bytes: int
    revision: str | None = None  # a pinned commit; None: main


def checkpoint_files(siblings: Iterable[tuple[str, int | None]]) -> dict[str, int | None]:
    """The repository files (name: size) a loadable checkpoint needs: its top-level weights,
    ``*.safetensors`` (or ``*.bin`` only where it has no safetensors), and its config and tokenizer files.

    Top level only: vLLM reads nothing below it, and some repositories keep a
    second copy of the weights in another format there (Llama's ``original/``).
    """
    top = {name: size for name, size in siblings if "/" not in name}
    weights = ".safetensors" if any(n.endswith(".safetensors") for n in top) else ".bin"
    return {name: size for name, size in top.items()
            if name.endswith(weights) or any(fnmatch(name, p) for p in AUXILIARY_PATTERNS)}


def fetch_all(needed: Sequence[tuple[str, str]], tokenizers: Collection[str] | None = None,
              revisions: Mapping[str, str | None] | None = None) -> dict[str, Path]:
    """Every hub checkpoint in ``needed`` as a local snapshot folder, downloaded where missing.

    ``needed``: (config key, reference) pairs, e.g. ``("model.path", "Qwen/Qwen2.5-7B-Instruct")``;
    references that are not hub ids (embedded, shipped heads, local folders)
    are left out, and a reference named under two keys is fetched once.
    ``tokenizers``: the references whose tokenizer vLLM loads (the target's,
    and a heterogeneous-vocabulary draft model's: :meth:`specbench.config.Cell.tokenizer_checkpoints`);
    a cached snapshot of one without its tokenizer files is missing, since
    every worker would fail on it. None: the target's (``model.path``) only.
    ``revisions``: the commit pinned for a hub id (the model config's
    ``revisions``), fetched and used in place of main; one line on stderr names
    each hub checkpoint without a pin (main's newest copy is used, and the rows
    record its commit). None: nothing pinned, nothing said. Each
    missing checkpoint's repository is looked up first, all of them before
    any download, and the downloads only start if the disk holds them all.

    Returns:
        Reference -> snapshot folder, for the hub checkpoints.

    Raises:
        HubError: one line per checkpoint that can be neither found nor downloaded
            (offline, hub unreachable, no such repository, gated without access),
            or one line when the disk lacks room for the downloads.
    """
    keys: dict[str, str] = {}
    for key, reference in needed:
        if isinstance(reference, str) and is_hub_id(reference):
            keys.setdefault(reference, key)
    if tokenizers is None:
        tokenizers = {reference for key, reference in needed if key == "model.path"}
    pins = dict(revisions or {})
    if revisions is not None:
        for reference, key in keys.items():
            if pins.get(reference) is None:
                print(f"warning: {key}={reference} has no pinned revision (model.revisions in its model config): "
                      f"the cache's copy of main is used, whichever commit that is; rows record it",
                      file=sys.stderr, flush=True)
    found: dict[str, Path] = {}
    missing: list[str] = []
    for reference in keys:
        snapshot = cached_snapshot(reference, tokenizer=reference in tokenizers, revision=pins.get(reference))
        if snapshot is None:
            missing.append(reference)
        else:
            found[reference] = snapshot
    if not missing:
        return found
    if offline():
        raise HubError("\n".join(_refusal(r, keys[r], "HF_HUB_OFFLINE=1 forbids downloading it", pins.get(r))
                                  for r in missing))
    downloads, errors = _plan_downloads([(keys[r], r) for r in missing], pins)
    if errors:
        raise HubError("\n".join(errors))
    _check_room(downloads)
    for download in downloads:
        found[download.repo_id] = _download(download, tokenizer=download.repo_id in tokenizers)
    return found


def fetch(reference: str, key: str, revision: str | None = None) -> Path:
    """One hub checkpoint (at ``revision``, a pinned commit, where given) as a local snapshot folder
    (see :func:`fetch_all`)."""
    return fetch_all([(key, reference)], revisions={reference: revision} if revision else None)[reference]


def _refusal(repo_id: str, key: str, why: str, revision: str | None = None) -> str:
    first = "unset HF_HUB_OFFLINE on a machine with network" if offline() else "connect this machine to the hub"
    # Weights without the tokenizer vLLM loads for it: say so, or the user finds the model "in the cache".
    where = (f"is in the Hugging Face cache ({cache_dir()}) without the tokenizer files vLLM loads for it "
             f"(tokenizer.json, tokenizer.model or vocab.json with merges.txt)"
             if cached_snapshot(repo_id, revision=revision) is not None
             else f"is not in the Hugging Face cache ({cache_dir()})")
    if revision is not None:
        where += f" at its pinned revision {revision} (model.revisions)"
    pinned = f" --revision {revision}" if revision else ""
    return (f"{key}={repo_id} {where} and {why}: {first}, "
            f"or run `hf download {repo_id}{pinned}` (huggingface-cli download on older huggingface_hub) on a machine "
            f"with network and copy its cache here, or set HF_HOME to a cache that holds it, "
            f"or point {key} at a local folder")


def _plan_downloads(needed: Sequence[tuple[str, str]], revisions: Mapping[str, str | None] | None = None
                    ) -> tuple[list[_Download], list[str]]:
    """Look each repository up once (files, sizes, access); the downloads, and one line per refusal."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    api = HfApi(endpoint=endpoint())
    downloads: list[_Download] = []
    errors: list[str] = []
    unreachable: str | None = None
    for key, repo_id in needed:
        if unreachable is not None:  # one timed-out probe is enough: the next would wait as long
            errors.append(_refusal(repo_id, key, unreachable))
            continue
        try:
            info = api.model_info(repo_id, revision=(revisions or {}).get(repo_id), files_metadata=True,
                                  timeout=PROBE_TIMEOUT_S)
            if info.gated:
                api.auth_check(repo_id)
        except GatedRepoError:
            errors.append(_gated(repo_id, key))
            continue
        except RepositoryNotFoundError:
            errors.append(f"{key}={repo_id}: no such model on {endpoint()} (or it is private: log in with "
                          f"`hf auth login` or set HF_TOKEN); check the id, or point {key} at a local folder")
            continue
        except HfHubHTTPError as exc:
            status = exc.response.status_code if exc.response is not None else "an error"
            errors.append(_refusal(repo_id, key, f"{endpoint()} answered {status} when asked for it"))
            continue
        except Exception as exc:  # noqa: BLE001 - any transport failure (DNS, refused, timeout, proxy): unreachable
            unreachable = f"the hub cannot be reached ({endpoint()}: {type(exc).__name__})"
            errors.append(_refusal(repo_id, key, unreachable))
            continue
        files = checkpoint_files((s.rfilename, s.size) for s in info.siblings or ())
        present = _repo_folder(repo_id) / "snapshots" / (info.sha or "")
        missing_bytes = sum(size or 0 for name, size in files.items() if not (present / name).is_file())
        downloads.append(_Download(repo_id, key, tuple(sorted(files)), missing_bytes, (revisions or {}).get(repo_id)))
    return downloads, errors


def _gated(repo_id: str, key: str) -> str:
    return (f"{key}={repo_id} is gated and this account has no access: accept its licence on "
            f"https://huggingface.co/{repo_id}, then log in with `hf auth login` (huggingface-cli login on older "
            f"huggingface_hub) or set HF_TOKEN to a token of that account")


def _check_room(downloads: Sequence[_Download]) -> None:
    """Refuse, in one line, downloads the cache's disk cannot hold."""
    total = sum(d.missing_bytes for d in downloads)
    folder = cache_dir()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if total > free:
        names = ", ".join(f"{d.repo_id} {_gb(d.missing_bytes)}" for d in downloads)
        raise HubError(f"not enough disk for the models to download: {_gb(total)} needed ({names}), {_gb(free)} "
                       f"free under {folder}; free some space, or set HF_HOME (or HF_HUB_CACHE) to a larger disk")


def _download(download: _Download, tokenizer: bool = False) -> Path:
    """Download one checkpoint's files into the cache, with huggingface_hub's progress bars."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError

    print(f"downloading {download.repo_id} ({download.key}): {_gb(download.missing_bytes)} into {cache_dir()}",
          file=sys.stderr, flush=True)
    try:
        # The pinned commit, found again by its snapshot folder; else main (not the probed commit), so that
        # refs/main is written and the next run finds it offline.
        folder = Path(snapshot_download(download.repo_id, revision=download.revision, cache_dir=cache_dir(),
                                        endpoint=endpoint(), allow_patterns=list(download.files)))
    except GatedRepoError:
        raise HubError(_gated(download.repo_id, download.key)) from None
    except (HfHubHTTPError, OSError) as exc:
        raise HubError(f"{download.key}={download.repo_id}: the download stopped ({type(exc).__name__}: "
                       f"{str(exc).splitlines()[0] if str(exc) else ''}); run the command again to resume it") from None
    if not _complete(folder):
        raise HubError(f"{download.key}={download.repo_id}: downloaded, but {folder} holds no config.json and "
                       f"weights vLLM can load (*.safetensors or *.bin); point {download.key} at a checkpoint folder")
    if tokenizer and not has_tokenizer(folder):
        raise HubError(f"{download.key}={download.repo_id}: downloaded, but {folder} holds no tokenizer "
                       f"(tokenizer.json, tokenizer.model or vocab.json with merges.txt), and vLLM loads this "
                       f"checkpoint's tokenizer; point {download.key} at a checkpoint folder that has one")
    return folder


def _gb(size: int) -> str:
    return f"{size / 1e9:.1f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"

