"""Scans the adapters folder and validates every `<src>2<tgt>` LoRA folder against the backbone, without the model.

Validation reads `adapter_config.json` and the safetensors *header* (tensor names and shapes), never the weights,
and compares them with a `BackboneSpec` taken once from the loaded model. An adapter that fails is listed as
unusable with its reason; it never reaches the model. Folders whose name is not a pair, or that are symlinks
leading outside the root, are ignored and listed in `ignored()`.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


from ..errors import AdapterNotFound, AdapterUnusable, TranslationError
from ..lora.peft_format import LORA_KEY, AdapterWeights, BackboneSpec, configured_rank, peft_targets
from .request import AdapterRequest, Pair

log = logging.getLogger(__name__)

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PICKLE_FILE = "adapter_model.bin"
METADATA_FILE = "metadata.json"
#: adapter_config.json bigger than this is not a LoRA config.
_MAX_CONFIG_BYTES = 1 << 20


@dataclass
class AdapterInfo:
    pair: Pair
    path: Path
    usable: bool
    reason: str | None = None
    rank: int | None = None
    alpha: float | None = None
    target_modules: list[str] = field(default_factory=list)
    size_bytes: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    #: (mtime_ns, size) of the config and the weights; a changed fingerprint means the folder was replaced.
    fingerprint: tuple[int, ...] | None = None
    #: Module paths the weights hold LoRA for, and the largest rank among them (what the slot layers must fit).
    modules: list[str] = field(default_factory=list)
    max_rank: int = 0
    #: Which version of the pair's adapter this is: "v1" is the pair's own folder, "vN" its subfolder (retrain.py).
    version: str = "v1"

    @property
    def key(self) -> str:
        return self.pair.key


def fingerprint_of(folder: Path) -> tuple[int, ...] | None:
    """(mtime_ns, size) of config and weights, or None when either is missing. A stat, not a read."""
    try:
        c, w = (folder / CONFIG_FILE).stat(), (folder / WEIGHTS_FILE).stat()
    except OSError:
        return None
    return (c.st_mtime_ns, c.st_size, w.st_mtime_ns, w.st_size)


def _lora_config(data: dict[str, Any]):
    """A peft LoraConfig from the JSON dict; unknown keys (written by other peft versions) are dropped."""
    import dataclasses

    from peft import LoraConfig

    names = {f.name for f in dataclasses.fields(LoraConfig)}
    return LoraConfig(**{k: v for k, v in data.items() if k in names})


def _read_config(folder: Path) -> tuple[Any, dict[str, Any]]:
    """(LoraConfig, raw dict) or AdapterUnusable with a reason that names the problem, not the path."""
    cfg_path = folder / CONFIG_FILE
    try:
        if cfg_path.stat().st_size > _MAX_CONFIG_BYTES:
            raise AdapterUnusable(f"{CONFIG_FILE} is larger than {_MAX_CONFIG_BYTES} bytes")
        data = json.loads(cfg_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AdapterUnusable(f"{CONFIG_FILE} is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterUnusable(f"{CONFIG_FILE} is unreadable ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise AdapterUnusable(f"{CONFIG_FILE} does not hold a JSON object")
    if str(data.get("peft_type", "")).upper() != "LORA":
        raise AdapterUnusable(f"not a LoRA adapter (peft_type={data.get('peft_type')!r})")
    try:
        config = _lora_config(data)
    except (TypeError, ValueError) as exc:
        raise AdapterUnusable(f"invalid LoRA config: {exc}") from None
    if getattr(config, "use_dora", False):
        raise AdapterUnusable("DoRA adapters are not supported (per-row mixed batches need plain LoRA)")
    if config.modules_to_save:
        raise AdapterUnusable("adapters with modules_to_save are not supported (they replace whole layers)")
    # Variants whose forward is not base(x) + B·A·x·scale, or that change more than linear layers.
    for field_name, what in _UNSUPPORTED.items():
        if getattr(config, field_name, None):
            raise AdapterUnusable(f"{what} are not supported (served adapters must be plain LoRA on linear layers)")
    return config, data


#: LoraConfig fields that make an adapter something the slot layers cannot serve, with their name for users.
_UNSUPPORTED = {
    "alora_invocation_tokens": "activated LoRA (aLoRA) adapters",
    "trainable_token_indices": "adapters with trainable tokens",
    "layer_replication": "adapters with layer_replication",
    "target_parameters": "LoRA on parameters (target_parameters)",
    "lora_bias": "adapters with a LoRA bias (lora_bias)",
    "use_qalora": "QA-LoRA adapters",
    "use_bdlora": "BD-LoRA adapters",
    "arrow_config": "Arrow-routed adapters",
}


def _check_shapes(shapes: dict[str, tuple[int, ...]], spec: BackboneSpec, config: Any) -> dict[str, int]:
    """Every tensor must be lora_A/lora_B of a Linear the backbone has, with fitting in/out widths and rank.
    Returns module path → rank."""
    if not shapes:
        raise AdapterUnusable(f"{WEIGHTS_FILE} holds no tensors")
    ranks: dict[str, dict[str, tuple[int, ...]]] = {}
    for key, shape in shapes.items():
        match = LORA_KEY.match(key)
        if match is None:
            raise AdapterUnusable(f"unexpected tensor {key!r} (only lora_A/lora_B weights are supported)")
        ranks.setdefault(match["module"], {})[match["part"]] = shape
    targeted = set(peft_targets(config, spec))
    if not targeted:
        shown = config.target_modules if isinstance(config.target_modules, str) else sorted(config.target_modules)
        raise AdapterUnusable(f"its target_modules {shown!r} (with layers_to_transform / "
                              f"exclude_modules) select no layer of this backbone ({spec.model_type})")
    for module, parts in sorted(ranks.items()):
        if module not in spec.shapes:
            raise AdapterUnusable(f"targets module {module!r}, which this backbone ({spec.model_type}) does not have")
        if module not in targeted:
            continue  # PEFT would not put a LoRA layer there and ignores these weights: so do we
        if set(parts) != {"lora_A", "lora_B"}:
            raise AdapterUnusable(f"module {module!r} lacks {({'lora_A', 'lora_B'} - set(parts)).pop()}")
        out_f, in_f = spec.shapes[module]
        a, b = parts["lora_A"], parts["lora_B"]
        if len(a) != 2 or len(b) != 2 or a[1] != in_f or b[0] != out_f or a[0] != b[1]:
            raise AdapterUnusable(
                f"shape mismatch at {module}: lora_A {list(a)} / lora_B {list(b)} do not fit a "
                f"{in_f}→{out_f} layer (trained for another base model?)"
            )
        rank = configured_rank(config, module)
        if a[0] != rank:
            # PEFT would build rank-r layers and then fail to copy these weights into them.
            raise AdapterUnusable(f"rank mismatch at {module}: lora_A {list(a)} has rank {a[0]}, the config "
                                  f"says r={rank}")
    # Every layer the config targets gets LoRA layers; weights missing for one mean an incomplete adapter.
    uncovered = sorted(m for m in targeted if m not in ranks)
    if uncovered:
        raise AdapterUnusable(f"{WEIGHTS_FILE} lacks lora_A/lora_B weights for {len(uncovered)} of the layers "
                              f"its target_modules select (e.g. {uncovered[0]})")
    return {module: int(parts["lora_A"][0]) for module, parts in ranks.items() if module in targeted}


def _header_shapes(weights: Path) -> dict[str, tuple[int, ...]]:
    """Tensor shapes from the safetensors header only (no weights read), or AdapterUnusable."""
    from safetensors import safe_open

    try:
        with safe_open(str(weights), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except FileNotFoundError:
        raise AdapterUnusable(f"{WEIGHTS_FILE} is missing") from None
    except Exception as exc:  # safetensors raises SafetensorError / OSError for truncated or garbage files
        raise AdapterUnusable(f"{WEIGHTS_FILE} is corrupt or truncated ({_short(exc)})") from None


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    # Messages from safetensors/OS may carry paths; keep only the gist.
    return re.sub(r"(?<![\w.])/(?:[^\s:'\"/]+/)*[^\s:'\"/]*", "<path>", text)[:160]


def validate(folder: Path, pair: Pair, spec: BackboneSpec) -> AdapterInfo:
    """AdapterInfo for one folder; never raises, an invalid adapter comes back with usable=False and a reason."""
    info = AdapterInfo(pair=pair, path=folder, usable=False, fingerprint=fingerprint_of(folder))
    try:
        meta_path = folder / METADATA_FILE
        if meta_path.is_file() and meta_path.stat().st_size <= _MAX_CONFIG_BYTES:
            try:
                meta = json.loads(meta_path.read_text(encoding="utf-8"))
                info.metadata = meta if isinstance(meta, dict) else {}
            except (OSError, ValueError):
                info.metadata = {}
        config, _ = _read_config(folder)
        info.rank, info.alpha = int(config.r), float(config.lora_alpha)
        tm = config.target_modules
        info.target_modules = sorted(tm) if isinstance(tm, (set, list, tuple)) else [str(tm)]
        weights = folder / WEIGHTS_FILE
        if not weights.exists():
            if (folder / PICKLE_FILE).exists():
                raise AdapterUnusable(f"only {PICKLE_FILE} (pickle) found; only safetensors adapters are loaded")
            raise AdapterUnusable(f"{WEIGHTS_FILE} is missing")
        for f in (folder / CONFIG_FILE, weights):
            if f.is_symlink() and not _inside(f.resolve(), folder.parent.resolve()):
                raise AdapterUnusable(f"{f.name} is a symlink leading outside the adapters folder")
        info.size_bytes = weights.stat().st_size
        if not spec.matching(config.target_modules) and not isinstance(config.target_modules, str):
            raise AdapterUnusable(
                f"target_modules {info.target_modules} match no layer of this backbone ({spec.model_type})"
            )
        module_ranks = _check_shapes(_header_shapes(weights), spec, config)
        info.modules = sorted(module_ranks)
        info.max_rank = max(module_ranks.values())
        info.usable = True
    except AdapterUnusable as exc:
        info.reason = exc.message
    except OSError as exc:
        info.reason = f"read error ({_short(exc)})"
    except (TypeError, ValueError) as exc:
        # A config field of the wrong type (e.g. lora_alpha: "x") must fail this adapter only, not the scan.
        info.reason = f"{CONFIG_FILE} has an invalid value ({_short(exc)})"
    return info


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def read_adapter(info: AdapterInfo) -> AdapterWeights:
    """Read an adapter's weights from disk. The fingerprint must still be the one seen at scan time.

    Raises AdapterUnusable naming the pair when the folder was deleted, replaced or damaged since the scan.
    """
    from safetensors.torch import load_file

    name = info.pair.key
    now = fingerprint_of(info.path)
    if now is None:
        raise AdapterUnusable(f"Adapter {name} was deleted or is incomplete since the last scan; rescan adapters.")
    if now != info.fingerprint:
        raise AdapterUnusable(f"Adapter {name} changed on disk since the last scan; rescan adapters to use it.")
    try:
        config, _ = _read_config(info.path)
        state_dict = load_file(str(info.path / WEIGHTS_FILE), device="cpu")
        if info.modules:
            # Only what validation kept: tensors for modules PEFT would not target are ignored, as PEFT does.
            keep = set(info.modules)
            state_dict = {k: v for k, v in state_dict.items()
                          if (m := LORA_KEY.match(k)) is not None and m["module"] in keep}
    except AdapterUnusable as exc:
        raise AdapterUnusable(f"Adapter {name} is unusable: {exc.message}") from None
    except Exception as exc:  # truncated/corrupt safetensors, read errors
        raise AdapterUnusable(f"Adapter {name} could not be read: {_short(exc)}") from None
    return AdapterWeights(pair=info.pair, config=config, state_dict=state_dict, fingerprint=now,
                          source=info.path / WEIGHTS_FILE)


#: A version's folder name: "v" and its number.
_VERSION = re.compile(r"v[0-9]{1,6}")


class AdapterRegistry:
    """The adapters folder as a map pair → AdapterInfo. The only way a filesystem path is produced from a pair."""

    def __init__(self, root: Path, spec: BackboneSpec,
                 versions: Callable[[], dict[str, str]] | None = None) -> None:
        """`versions`: pair key → the version that serves it, where it is not "v1" (the store's record)."""
        self.root = Path(root)
        self.spec = spec
        self.versions = versions
        self._lock = threading.Lock()
        self._infos: dict[Pair, AdapterInfo] = {}
        self._ignored: list[tuple[str, str]] = []

    def scan(self) -> list[AdapterInfo]:
        """Re-read the folder. Returns every adapter found, usable or not (sorted by key)."""
        infos: dict[Pair, AdapterInfo] = {}
        ignored: list[tuple[str, str]] = []
        root = self.root.resolve() if self.root.exists() else self.root
        current = self.versions() if self.versions is not None else {}
        if not self.root.is_dir():
            log.warning("adapters folder %s does not exist; no adapters registered", self.root)
        else:
            for entry in sorted(self.root.iterdir(), key=lambda p: p.name):
                if entry.name.startswith(".") or not entry.is_dir():
                    continue
                try:
                    pair = Pair.parse(entry.name)
                except TranslationError as exc:
                    ignored.append((entry.name[:64], f"not a <src>2<tgt> pair name: {exc.message}"))
                    continue
                if entry.name != pair.key:  # "EN2es" would alias "en2es"; only canonical names count
                    ignored.append((entry.name, f"not the canonical name, rename it to {pair.key}"))
                    continue
                if entry.is_symlink() and not _inside(entry.resolve(), root):
                    ignored.append((entry.name, "symlink leading outside the adapters folder"))
                    continue
                version = current.get(pair.key, "v1")
                folder = entry / version if version != "v1" else entry
                if not _VERSION.fullmatch(version) or not folder.is_dir():
                    log.error("adapter %s: version %s is recorded as current but %s is missing; serving v1",
                              pair.key, version, folder)
                    folder, version = entry, "v1"
                infos[pair] = dataclasses.replace(validate(folder, pair, self.spec), version=version)
        with self._lock:
            self._infos, self._ignored = infos, ignored
        usable = sum(i.usable for i in infos.values())
        log.info("adapter registry: %d usable, %d unusable, %d ignored in %s", usable, len(infos) - usable,
                 len(ignored), self.root)
        for info in infos.values():
            if not info.usable:
                log.warning("adapter %s is unusable: %s", info.key, info.reason)
        return self.infos()

    def get(self, pair: Pair) -> AdapterInfo:
        with self._lock:
            info = self._infos.get(pair)
        if info is None:
            raise AdapterNotFound(f"No adapter for {pair.key}.")
        if not info.usable:
            raise AdapterUnusable(f"Adapter {pair.key} is unusable: {info.reason}")
        return info

    def request(self, pair: Pair) -> AdapterRequest:
        return AdapterRequest(pair=pair, path=self.get(pair).path)

    def usable_pairs(self) -> set[Pair]:
        with self._lock:
            return {p for p, i in self._infos.items() if i.usable}

    def infos(self) -> list[AdapterInfo]:
        with self._lock:
            return sorted(self._infos.values(), key=lambda i: i.key)

    def ignored(self) -> list[tuple[str, str]]:
        """(folder name, reason) for folders that are not adapters at all."""
        with self._lock:
            return list(self._ignored)
